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

func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	cases := []struct {
		name string
		ds   []time.Duration
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of odd", ms(5, 1, 3), 0.5, 3 * time.Millisecond},
		{"median of even is the lower", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 20 is the largest", ms(20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19), 0.99, 20 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.ds)
			if got := Quantile(in, tc.q); got != tc.want {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tc.ds, tc.q, got, tc.want)
			}
			if !slices.Equal(in, tc.ds) {
				t.Errorf("Quantile reordered its input: %v, was %v", in, tc.ds)
			}
		})
	}
}
