package bench

import (
	"slices"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want time.Duration
	}{
		{"none", nil, 0},
		{"one", []time.Duration{7}, 7},
		{"odd unsorted", []time.Duration{3, 1, 2}, 2},
		{"even: the upper middle", []time.Duration{4, 1, 3, 2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			if got := Median(in); got != tc.want {
				t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
			}
			if !slices.Equal(in, tc.in) {
				t.Errorf("Median reordered its input: %v, was %v", in, tc.in)
			}
		})
	}
}
