package daemon

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

func TestZoneUnion(t *testing.T) {
	var got map[string][]string
	var gone []string
	fail := false
	u := newZoneUnion(func(_ context.Context, z map[string][]string) error {
		if fail {
			return errors.New("refused")
		}
		got = z
		return nil
	}, func(z []string) { gone = append(gone, z...) })
	ctx := context.Background()
	api, sdn := u.source("api"), u.source("sdn")
	steps := []struct {
		name string
		set  func() error
		want map[string][]string
		err  bool
		gone []string // the zones the step dropped (the egress part forgets them)
	}{
		{"api zone", func() error { return api(ctx, map[string][]string{"sb1": {"sb1v0"}}) },
			map[string][]string{"sb1": {"sb1v0"}}, false, nil},
		{"sdn adds its zones, same id joins", func() error {
			return sdn(ctx, map[string][]string{"sb1": {"sb1v1", "sb1v0"}, "abc123z": {"abc123v0", "abc123v1"}})
		}, map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, false, nil},
		{"api drops its zone, sdn keeps it", func() error { return api(ctx, nil) },
			map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, false, nil},
		{"a refused set changes nothing", func() error {
			fail = true
			defer func() { fail = false }()
			return sdn(ctx, map[string][]string{})
		}, map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}}, true, nil},
		{"the next set still holds the old sdn zones", func() error { return api(ctx, map[string][]string{"sb2": {"sb2v0"}}) },
			map[string][]string{"sb1": {"sb1v0", "sb1v1"}, "abc123z": {"abc123v0", "abc123v1"}, "sb2": {"sb2v0"}}, false, nil},
		{"sdn drops its zones: the ones no other source holds are gone", func() error { return sdn(ctx, nil) },
			map[string][]string{"sb2": {"sb2v0"}}, false, []string{"abc123z", "sb1"}},
	}
	for _, s := range steps {
		gone = nil
		err := s.set()
		if (err != nil) != s.err {
			t.Fatalf("%s: err %v", s.name, err)
		}
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s: guard got %v, want %v", s.name, got, s.want)
		}
		if !reflect.DeepEqual(gone, s.gone) {
			t.Errorf("%s: zones gone %v, want %v", s.name, gone, s.gone)
		}
	}
}
