package qga

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestParseFSInfo: guest-get-fsinfo answers are decoded and bounded: a
// list longer than the cap is cut, long or invalid strings are clipped,
// missing or negative sizes read as 0, and what is not a list is a
// protocol error.
func TestParseFSInfo(t *testing.T) {
	long := strings.Repeat("x", 1000)
	many := "[" + strings.TrimSuffix(strings.Repeat(`{"name":"a","mountpoint":"/","type":"ext4"},`, 100), ",") + "]"
	for _, tc := range []struct {
		name    string
		raw     string
		n       int
		wantErr bool
		check   func([]Filesystem) error
	}{
		{"qemu-ga 8", `[{"name":"vda1","mountpoint":"/","type":"ext4","used-bytes":900,"total-bytes":1000,"disk":[{"bus-type":"virtio","bus":0,"unit":0,"target":0,"serial":"x"}]}]`, 1, false,
			func(fs []Filesystem) error {
				if size(fs[0].UsedBytes) != 900 || size(fs[0].TotalBytes) != 1000 || fs[0].Mountpoint != "/" {
					return fmt.Errorf("%+v", fs[0])
				}
				return nil
			}},
		{"no sizes (old agent)", `[{"name":"vda1","mountpoint":"/","type":"ext4","disk":[]}]`, 1, false,
			func(fs []Filesystem) error {
				if size(fs[0].UsedBytes) != 0 || size(fs[0].TotalBytes) != 0 {
					return fmt.Errorf("%+v", fs[0])
				}
				return nil
			}},
		{"negative size", `[{"name":"a","mountpoint":"/","type":"x","used-bytes":-5,"total-bytes":-1}]`, 1, false,
			func(fs []Filesystem) error {
				if size(fs[0].UsedBytes) != 0 {
					return fmt.Errorf("%+v", fs[0])
				}
				return nil
			}},
		{"long strings", `[{"name":"` + long + `","mountpoint":"/` + long + `","type":"` + "\xff\xfe" + `"}]`, 1, false,
			func(fs []Filesystem) error {
				if len(fs[0].Name) > maxFSString || len(fs[0].Mountpoint) > maxFSString || !utf8.ValidString(fs[0].Type) {
					return fmt.Errorf("not clipped: %d %d %q", len(fs[0].Name), len(fs[0].Mountpoint), fs[0].Type)
				}
				return nil
			}},
		{"too many", many, maxFilesystems, false, nil},
		{"not a list", `{"name":"a"}`, 0, true, nil},
		{"wrong types", `[{"name":1}]`, 0, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := parseFSInfo([]byte(tc.raw))
			if (err != nil) != tc.wantErr || len(fs) != tc.n {
				t.Fatalf("%d filesystems, err %v; want %d, error %v", len(fs), err, tc.n, tc.wantErr)
			}
			if tc.check != nil {
				if err := tc.check(fs); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// FuzzParseFSInfo: any answer yields a bounded list of valid strings or an
// error, never a panic.
func FuzzParseFSInfo(f *testing.F) {
	f.Add([]byte(`[{"name":"vda1","mountpoint":"/","type":"ext4","used-bytes":1,"total-bytes":2}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		fs, err := parseFSInfo(raw)
		if err != nil {
			return
		}
		if len(fs) > maxFilesystems {
			t.Fatalf("%d filesystems", len(fs))
		}
		for _, x := range fs {
			for _, s := range []string{x.Name, x.Mountpoint, x.Type} {
				if len(s) > maxFSString+3*maxFSString || !utf8.ValidString(s) {
					t.Fatalf("string %q", s)
				}
			}
		}
	})
}
