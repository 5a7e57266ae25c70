package pveemu

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// imageInfo is what pve-storage's file_size_info reads of an image
// through `qemu-img info`: its format, virtual size and backing file.
type imageInfo struct {
	format  string
	size    int64 // virtual size in bytes
	backing string
}

var (
	qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}
	vmdkMagic  = []byte{'K', 'D', 'M', 'V'}
)

// probeImage is pve-storage Plugin.pm file_size_info(path, timeout,
// format, untrusted=1) for the formats an import or ISO volume can have,
// read from the headers instead of `qemu-img info`: format is the
// format the caller expects ("" for auto-detect). The errors are the
// ones file_size_info dies with for an untrusted image (qemu-img's own
// for a file that is not in the format given). Not read: a qcow2's
// external data file ("'data-file' references are not allowed!") and a
// vmdk's extents (monolithic sparse files only).
func probeImage(path, format string) (imageInfo, error) {
	return probeImageAs(path, format, path)
}

// probeImageAs is probeImage naming the file shown in its errors.
func probeImageAs(path, format, shown string) (imageInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return imageInfo{}, fmt.Errorf("failed to stat '%s'", shown)
	}
	if st.IsDir() {
		return imageInfo{}, fmt.Errorf("expected format '%s', but '%s' is a directory", format, shown)
	}
	f, err := os.Open(path)
	if err != nil {
		return imageInfo{}, fmt.Errorf("failed to query file information with qemu-img")
	}
	defer f.Close()
	hdr := make([]byte, 512)
	n, _ := io.ReadFull(f, hdr)
	hdr = hdr[:n]
	detected := "raw"
	switch {
	case bytes.HasPrefix(hdr, qcow2Magic):
		detected = "qcow2"
	case bytes.HasPrefix(hdr, vmdkMagic):
		detected = "vmdk"
	}
	if format == "" {
		format = detected
	}
	info := imageInfo{format: format, size: st.Size()}
	switch format {
	case "raw":
		// qemu-img reads any file as raw: its size is the file's
		return info, nil
	case "qcow2":
		if detected != "qcow2" || len(hdr) < 32 {
			return imageInfo{}, fmt.Errorf("qemu-img: Could not open '%s': Image is not in qcow2 format", shown)
		}
		info.size = int64(binary.BigEndian.Uint64(hdr[24:32]))
		off, blen := binary.BigEndian.Uint64(hdr[8:16]), binary.BigEndian.Uint32(hdr[16:20])
		if off != 0 && blen > 0 {
			name := make([]byte, min(blen, 1023))
			if _, err := f.ReadAt(name, int64(off)); err != nil {
				return imageInfo{}, fmt.Errorf("qemu-img: Could not open '%s': Could not read backing file name", shown)
			}
			info.backing = string(name)
		}
	case "vmdk":
		if detected != "vmdk" || len(hdr) < 20 {
			return imageInfo{}, fmt.Errorf("qemu-img: Could not open '%s': Invalid footer", shown)
		}
		info.size = int64(binary.LittleEndian.Uint64(hdr[12:20])) * 512
	default:
		return imageInfo{}, fmt.Errorf("emulator: image format '%s' is not emulated", format)
	}
	if info.backing != "" {
		return imageInfo{}, fail("backing file not allowed for untrusted image '%s'!", shown)
	}
	return info, nil
}

// assertOVAContents is pve-storage API2/Storage/Status.pm
// assert_ova_contents: the file is a tar archive (`tar -t`) with a
// member ending in .ovf.
func assertOVAContents(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	hasOVF := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// tar -t fails: run_command's error
			return fmt.Errorf("command 'tar -t -f %s' failed: exit code 2", path)
		}
		if strings.HasSuffix(h.Name, ".ovf") {
			hasOVF = true
		}
	}
	if !hasOVF {
		return errors.New("ova archive has no .ovf file inside")
	}
	return nil
}

// extractOVAMember is pve-storage GuestImport.pm
// extract_disk_from_import_file's `tar -x` of member from the OVA at path
// into dir (a temporary directory of the caller's); the member must be a
// regular file. It returns the extracted file's path.
func extractOVAMember(path, member, archiveVolid, dir string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("command 'tar -x --force-local --no-same-owner -C %s -f %s %s' failed: exit code 2", dir, path, member)
		}
		if err != nil {
			return "", err
		}
		if h.Name != member {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			return "", fmt.Errorf("extracted file '%s' from archive '%s' is not a regular file", member, archiveVolid)
		}
		out := filepath.Join(dir, member)
		w, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(w, tr)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		return out, err
	}
}
