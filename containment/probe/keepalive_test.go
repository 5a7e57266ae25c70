package probe

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// signalOnReady is the host's side of a keep-alive target in a test: on
// the ready line it runs cut, then creates the signal file.
type signalOnReady struct {
	t      *testing.T
	signal string
	cut    func()
	lines  []string
}

func (w *signalOnReady) Write(b []byte) (int, error) {
	w.lines = append(w.lines, string(b))
	if strings.HasPrefix(string(b), ReadyPrefix) {
		w.cut()
		if err := os.WriteFile(w.signal, nil, 0o600); err != nil {
			w.t.Error(err)
		}
	}
	return len(b), nil
}

func TestKeepAliveTarget(t *testing.T) {
	b := newProbeBed(t)
	for _, tc := range []struct {
		name    string
		cut     bool // the server closes every connection between the requests
		outcome Outcome
		detail  string
	}{
		{"connection kept", false, OutcomeResponse, "answered a second request"},
		{"connection cut", true, OutcomeOpen, "second request on the old connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := b.ns.Listen(t, "tcp4", "127.0.0.1:0")
			s := httptest.NewUnstartedServer(testkit.Handler())
			s.Listener.Close()
			s.Listener = l
			s.StartTLS()
			t.Cleanup(s.Close)
			_, port, _ := strings.Cut(l.Addr().String(), ":")
			signal := filepath.Join(t.TempDir(), "go")
			w := &signalOnReady{t: t, signal: signal, cut: func() {
				if tc.cut {
					s.Close()
				}
			}}
			p := &Prober{Dialer: b.ns, Ready: w}
			tg := Target{ID: "k1", Kind: KindKeepAlive, Addr: "0.0.0.0:" + port, Name: "local.test", Resolver: b.dns4, Signal: signal}
			req := &Request{Version: Version, Targets: []Target{tg}}
			if err := ValidateRequest(req); err != nil {
				t.Fatal(err)
			}
			r := p.Run(context.Background(), req).Results[0]
			if r.Outcome != tc.outcome || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("result %+v, want %s with %q", r, tc.outcome, tc.detail)
			}
			if len(w.lines) != 1 || w.lines[0] != ReadyPrefix+"k1\n" {
				t.Errorf("ready lines %q", w.lines)
			}
			if _, err := os.Stat(signal); !os.IsNotExist(err) {
				t.Errorf("the signal file was not removed: %v", err)
			}
		})
	}
	// the first request unanswered proves nothing: an error, no ready line
	w := &signalOnReady{t: t, signal: filepath.Join(t.TempDir(), "go"), cut: func() {}}
	tg := Target{ID: "k2", Kind: KindKeepAlive, Addr: "0.0.0.0:" + b.refusedPort, Name: "local.test", Resolver: b.dns4, Signal: w.signal}
	r := (&Prober{Dialer: b.ns, Ready: w}).Run(context.Background(), &Request{Version: Version, Targets: []Target{tg}}).Results[0]
	if r.Outcome != OutcomeError || !strings.Contains(r.Detail, "first request") || len(w.lines) != 0 {
		t.Errorf("refused first request: %+v, ready lines %q", r, w.lines)
	}
}

func TestValidateKeepAlive(t *testing.T) {
	ok := Target{ID: "k", Kind: KindKeepAlive, Addr: "0.0.0.0:80", Name: "a.test", Resolver: "10.0.0.1:53", Signal: "/tmp/x.signal"}
	for _, tc := range []struct {
		name string
		mod  func(*Target)
		ok   bool
	}{
		{"valid", func(*Target) {}, true},
		{"with path and host", func(t *Target) { t.Path = "/a"; t.Host = "b.test" }, true},
		{"no signal", func(t *Target) { t.Signal = "" }, false},
		{"relative signal", func(t *Target) { t.Signal = "tmp/x" }, false},
		{"unclean signal", func(t *Target) { t.Signal = "/tmp/../etc/x" }, false},
		{"signal with a space", func(t *Target) { t.Signal = "/tmp/a b" }, false},
		{"no name", func(t *Target) { t.Name, t.Resolver = "", "" }, false},
		{"literal address", func(t *Target) { t.Addr = "10.0.0.2:80" }, false},
		{"method", func(t *Target) { t.Method = "PUT" }, false},
		{"signal on http", func(t *Target) { t.Kind = KindHTTP }, false},
	} {
		tg := ok
		tc.mod(&tg)
		err := ValidateRequest(&Request{Version: Version, Targets: []Target{tg}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestRunBoundKeepAlive(t *testing.T) {
	tcp := Target{Kind: KindTCP, Addr: "10.0.0.1:22", TimeoutMS: 1000}
	ka := Target{Kind: KindKeepAlive, Addr: "0.0.0.0:80", Name: "a.test", Resolver: "10.0.0.1:53", Signal: "/tmp/s", TimeoutMS: 2000}
	req := &Request{Version: Version, Concurrency: 2, Targets: []Target{ka, tcp, tcp, tcp}}
	// two rounds of the tcp targets' 1s, and the keep-alive's two
	// requests of 2s and its wait
	if got, want := RunBound(req), 2*time.Second+4*time.Second+KeepAliveWaitMS*time.Millisecond; got != want {
		t.Errorf("bound %v, want %v", got, want)
	}
}
