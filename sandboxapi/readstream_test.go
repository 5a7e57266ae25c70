package sandboxapi

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// sizedFake reports size, then writes data.
type sizedFake struct {
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
		{"fits", sizedFake{5, "hello"}, "", "hello", "5", false},
		{"over the cap before any byte", sizedFake{11, "hello world"}, ProblemOutputLimit, "", "", true},
		{"grew after the size was taken", sizedFake{5, "hello world"}, "", "hello", "5", false},
		{"empty", sizedFake{0, ""}, "", "", "0", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{}
			s.o.MaxFileBytes = 10
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/x", nil)
			err := s.streamFile(rec, req, tt.g, "/f")
			if tt.wantError {
				var p *Problem
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
