package sandboxapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// sizedFake reports size, then writes data.
type sizedFake struct {
	sandbox.Guest
	size int64
	data string
}

func (f sizedFake) ReadFileSized(ctx context.Context, path string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	if err := size(f.size); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, strings.NewReader(f.data))
	return n, err
}

func TestStreamFile(t *testing.T) {
	tests := []struct {
		name      string
		g         sizedFake
		wantProb  string
		wantBody  string
		wantCLen  string
		wantError bool
	}{
		{"fits", sizedFake{nil, 5, "hello"}, "", "hello", "5", false},
		{"over the cap before any byte", sizedFake{nil, 11, "hello world"}, apitype.ProblemOutputLimit, "", "", true},
		{"grew after the size was taken", sizedFake{nil, 5, "hello world"}, "", "hello", "5", false},
		{"empty", sizedFake{nil, 0, ""}, "", "", "0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{e: diskEngine(t, nil, 0)}
			s.o.MaxFileBytes = 10
			rec := httptest.NewRecorder()
			err := s.streamFile(context.Background(), rec, 100, tt.g, "/f")
			if tt.wantError {
				var p *apitype.Problem
				if !errors.As(err, &p) || p.Type != tt.wantProb {
					t.Fatalf("got %v, want problem %s", err, tt.wantProb)
				}
				if rec.Body.Len() != 0 || rec.Code != 200 || len(rec.Header()) != 0 {
					t.Fatalf("response started before the cap check: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
				}
				return
			}
			if err != nil || rec.Body.String() != tt.wantBody || rec.Header().Get("Content-Length") != tt.wantCLen {
				t.Fatalf("got err=%v body=%q len=%q", err, rec.Body.String(), rec.Header().Get("Content-Length"))
			}
		})
	}
}

// diskEngine is an engine on fakes whose guests are nil and whose disk
// path is dt (nil: none) from threshold bytes.
func diskEngine(t *testing.T, dt sandbox.DiskTransfer, threshold int64) *sandbox.Engine {
	t.Helper()
	e, err := sandbox.New(sandbox.Options{Node: "n1", Proxmox: apitest.NewProxmox(apitest.NewGuests(), nil),
		Guests: func(string) sandbox.Guest { return nil }, StateDir: t.TempDir(), DiskTransfer: dt, DiskThreshold: threshold})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// diskFake is a DiskTransfer that records calls and sends data or fails.
type diskFake struct {
	data string
	err  error
	got  []string
}

func (d *diskFake) Upload(ctx context.Context, vmid int, g sandbox.Guest, path string, r io.Reader, size int64, mode os.FileMode) error {
	b, _ := io.ReadAll(r)
	d.got = append(d.got, fmt.Sprintf("up %d %s %d %q", vmid, path, size, b))
	return d.err
}

func (d *diskFake) Download(ctx context.Context, vmid int, g sandbox.Guest, path string, size int64, w io.Writer) (int64, error) {
	d.got = append(d.got, fmt.Sprintf("down %d %s %d", vmid, path, size))
	if d.err != nil {
		return 0, d.err
	}
	n, err := io.WriteString(w, d.data)
	return int64(n), err
}

func TestStreamFileDiskPath(t *testing.T) {
	tests := []struct {
		name     string
		size     int64
		disk     *diskFake
		wantCall string
		wantBody string
		wantErr  error
	}{
		{"below the threshold: agent", 5, &diskFake{}, "", "hello", nil},
		{"at the threshold: disk", 8, &diskFake{data: "diskdata"}, "down 100 /f 8", "diskdata", nil},
		{"disk path fails before the first byte", 9, &diskFake{err: sandbox.ErrGuestNoSpace}, "down 100 /f 9", "", sandbox.ErrGuestNoSpace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{e: diskEngine(t, tt.disk, 8)}
			s.o.MaxFileBytes = 100
			rec := httptest.NewRecorder()
			err := s.streamFile(context.Background(), rec, 100, sizedFake{nil, tt.size, "hello"}, "/f")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got %v, want %v", err, tt.wantErr)
			}
			if got := strings.Join(tt.disk.got, ";"); got != tt.wantCall {
				t.Errorf("disk calls %q, want %q", got, tt.wantCall)
			}
			if rec.Body.String() != tt.wantBody {
				t.Errorf("body %q, want %q", rec.Body.String(), tt.wantBody)
			}
			if tt.wantErr != nil && len(rec.Header()) != 0 {
				t.Errorf("headers sent before the failure: %v", rec.Header())
			}
		})
	}
}
