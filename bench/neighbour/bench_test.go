package neighbour

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPrintVerdicts(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    Figure
		want string
	}{
		{"within 2x", Figure{Name: "exec", Alone: ms(1, 2, 4), Attacked: ms(2, 3, 8)}, "met"},
		{"over 2x", Figure{Name: "exec", Alone: ms(1, 2, 4), Attacked: ms(2, 3, 9)}, "MISSED: p99 2.25x of alone"},
		{"over the goal", Figure{Name: "api", Goal: 20 * time.Millisecond, Alone: ms(10, 15), Attacked: ms(10, 21)}, "MISSED: p99 21ms over 20ms"},
		{"failed probes", Figure{Name: "exec", Alone: ms(1), Attacked: ms(1), Failed: 3, FirstFail: "refused"}, "MISSED: 3 probes failed under attack (first: refused)"},
		{"no samples", Figure{Name: "exec", Alone: ms(1)}, "MISSED: no samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			Result{Figures: []Figure{tc.f}, VMs: 2}.Print(&b)
			var verdict string
			for _, l := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(l, "  "+tc.f.Name+" ") {
					verdict = strings.TrimSpace(strings.TrimPrefix(l, "  "+tc.f.Name))
				}
			}
			if verdict != tc.want {
				t.Errorf("verdict %q, want %q; printed:\n%s", verdict, tc.want, b.String())
			}
		})
	}
}
