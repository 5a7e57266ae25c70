package testkit

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Series gathers g and returns the value of every series whose labels
// include match (a gauge's, counter's or untyped value), keyed by its
// name and, in braces, its other labels that have a value, sorted:
// `x_bytes_total{direction="to_guest"}`, or `x_bytes` when it has none.
func Series(t testing.TB, g prometheus.Gatherer, match map[string]string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			var rest []string
			for k, v := range have {
				if want, ok := match[k]; ok {
					if v != want {
						continue metrics
					}
				} else if v != "" {
					rest = append(rest, k+`="`+v+`"`)
				}
			}
			for k := range match {
				if _, ok := have[k]; !ok {
					continue metrics
				}
			}
			key := mf.GetName()
			if len(rest) > 0 {
				slices.Sort(rest)
				key += "{" + strings.Join(rest, ",") + "}"
			}
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return out
}
