package egress

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestEgressFirstQuestionOnBed: the first question of a guest whose zone
// was just set to an allow-list, redirected by the guard to the
// resolver's socket before the resolver reads it (as at a daemon's
// start: the guard's table is in force before the read loop runs), is
// answered and its address opened, not dropped as no guest's.
func TestEgressFirstQuestionOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStackWith(t, ctx, Policy{Mode: "open"}, stackConfig{holdUDP: true})
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	type answer struct {
		addrs []string
		err   error
	}
	got := make(chan answer, 1)
	go func() {
		addrs, err := s.resolveOnce("zonea", testvm.InternetName, testvm.InternetAddr+":53", false)
		got <- answer{addrs, err}
	}()
	waitQueued(t, s.pc)
	s.serveUDP()
	a := <-got
	if a.err != nil || !slices.Equal(a.addrs, []string{testvm.InternetAddr}) {
		t.Fatalf("first question, queued before the read loop: %v, %v; want [%s]", a.addrs, a.err, testvm.InternetAddr)
	}
	if body, err := s.get("zonea", "http://"+testvm.InternetName+"/", testvm.InternetAddr+":80"); err != nil || body != "internet host" {
		t.Errorf("the answered name's address: %q, %v", body, err)
	}
}
