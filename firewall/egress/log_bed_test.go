package egress

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestEgressRecordOnBed: an allowlist guest resolves an allowed and a
// denied name and fetches through the proxy; its sandbox's record lists
// each with the right verdict, the connection with bytes each way, all
// named by the guest's VM from the guard's port map; another sandbox's
// record is empty.
func TestEgressRecordOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := NewLog(LogConfig{PerOwner: 64})
	s := newRecordingStack(t, ctx, log)
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 {
		t.Fatalf("resolve allowed: %v, %v", got, err)
	}
	if _, err := s.resolve("zonea", "evil.example.org", s.gw["zonea"]+":53", false); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
		t.Fatalf("resolve denied: %v", err)
	}
	body, err := s.get("zonea", "http://"+testvm.InternetName+"/", testvm.InternetAddr+":80")
	if err != nil || body != "internet host" {
		t.Fatalf("fetch: %q, %v", body, err)
	}
	var conn []Record
	for range 50 { // the record is written when the proxy's side of the connection ends
		if conn = log.Read("sb-zonea", LogQuery{Type: RecordConn}).Records; len(conn) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	vmid := s.guests["zonea"].VMID
	dns := log.Read("sb-zonea", LogQuery{Type: RecordDNS}).Records
	verdicts := map[string]string{}
	for _, r := range dns {
		verdicts[r.Name] = r.Verdict + "/" + r.Reason
		if r.Guest.VMID != vmid {
			t.Errorf("DNS record of VM %d, want %d: %+v", r.Guest.VMID, vmid, r)
		}
	}
	if verdicts[testvm.InternetName] != VerdictAnswered+"/" || verdicts["evil.example.org"] != VerdictRefused+"/"+ReasonName {
		t.Errorf("DNS records %v", verdicts)
	}
	if len(conn) != 1 {
		t.Fatalf("connection records %+v, want one", conn)
	}
	c := conn[0]
	if c.Verdict != VerdictAllowed || c.Name != testvm.InternetName || c.Check != ReasonHost || c.Dest.String() != testvm.InternetAddr+":80" ||
		c.BytesOut < 40 || c.BytesIn < int64(len("internet host")) || c.Guest.VMID != vmid {
		t.Errorf("connection record %+v", c)
	}
	if n := len(log.Read("sb-zoneb", LogQuery{}).Records); n != 0 {
		t.Errorf("zoneb's record has %d entries of zonea's traffic", n)
	}
}
