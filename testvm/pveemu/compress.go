package pveemu

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"strings"
)

// compressMin is the body size from which pve-http-server compresses an
// answer (AnyEvent.pm response: `$content_length > 1024`).
const compressMin = 1024

// proxyBodyCliff is the compressed body size from which the emulator
// answers a protected call 597, the way pveproxy answers a large
// incompressible answer pvedaemon sent it compressed (FIDELITY.md, issue
// 35: the size is the emulator's choice, the behaviour is observed).
const proxyBodyCliff = 8 << 20

// errBrokenPipe is pveproxy's answer when AnyEvent::HTTP fails receiving
// pvedaemon's body: status 597 with the error as reason, no body.
var errBrokenPipe = &apiError{code: 597, msg: "Broken pipe\n", bare: true}

// compressAnswer is pve-http-server's response compression of a successful
// API answer: with `gzip` in Accept-Encoding a body over compressMin
// bytes is gzipped (memGzip), else with `deflate` zlib-compressed
// (Compress::Zlib::compress). The header is matched as a substring, as
// AnyEvent.pm does (`m/gzip/`). A protected call's answer comes from
// pvedaemon through proxy_request; past proxyBodyCliff it fails as
// errBrokenPipe.
func compressAnswer(acceptEncoding string, protected bool, body []byte) ([]byte, string, error) {
	gz, df := strings.Contains(acceptEncoding, "gzip"), strings.Contains(acceptEncoding, "deflate")
	if len(body) <= compressMin || (!gz && !df) {
		return body, "", nil
	}
	var buf bytes.Buffer
	enc := "gzip"
	if gz {
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
	} else {
		enc = "deflate"
		zw := zlib.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
	}
	if protected && buf.Len() > proxyBodyCliff {
		return nil, "", errBrokenPipe
	}
	return buf.Bytes(), enc, nil
}
