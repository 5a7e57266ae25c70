package layer2

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestRunLayer2Small(t *testing.T) {
	testkit.RequireRoot(t, "nft")
	var buf bytes.Buffer
	r, err := RunLayer2(context.Background(), Layer2Options{Ports: 20, Rounds: 1, Updates: 3}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	if r.ApplyWith <= 0 || r.ApplyWithout <= 0 || r.UpdateWith <= 0 || r.UpdateWithout <= 0 || r.ZonesWith <= 0 {
		t.Errorf("non-positive figures: %+v", r)
	}
	if !strings.Contains(buf.String(), "20 guest ports") {
		t.Errorf("output does not name the port count:\n%s", buf.String())
	}
}
