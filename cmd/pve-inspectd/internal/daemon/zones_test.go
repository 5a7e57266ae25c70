package daemon

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

func TestZoneUnion(t *testing.T) {
	var got map[string][]string
	fail := false
	u := newZoneUnion(func(_ context.Context, z map[string][]string) error {
		if fail {
			return errors.New("refused")
		}
		got = z
		return nil
	})
	ctx := context.Background()
	api, sdn := u.source("api"), u.source("sdn")
	steps := []struct {
		name string
		set  func() error
		want map[string][]string
		err  bool
	}{
		{"api zone", func() error { return api(ctx, map[string][]string{"sb1": {"sb1v0"}}) },
			map[string][]string{"sb1": {"sb1v0"}}, false},
		{"sdn adds its zones, same id joins", func() error {
			return sdn(ctx, map[string][]string{"sb1": {"sb1v1", "sb1v0"}, "abc123z": {"abc123v0", "abc123v1"}})
		}, map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, false},
		{"api drops its zone, sdn keeps it", func() error { return api(ctx, nil) },
			map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, false},
		{"a refused set changes nothing", func() error {
			fail = true
			defer func() { fail = false }()
			return sdn(ctx, map[string][]string{})
		}, map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, true},
		{"the next set still holds the old sdn zones", func() error { return api(ctx, map[string][]string{"sb2": {"sb2v0"}}) },
			map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}, "sb2": {"sb2v0"}}, false},
	}
	for _, s := range steps {
		err := s.set()
		if (err != nil) != s.err {
			t.Fatalf("%s: err %v", s.name, err)
		}
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s: guard got %v, want %v", s.name, got, s.want)
		}
	}
}
