package egress

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// someRecords adds n records of both types to owner's ring.
func someRecords(l *Log, owner string, n int) {
	r := l.Open(owner)
	for i := range n {
		if i%3 == 2 { // a kernel flow, with its packets
			r.Add(Record{Type: RecordFlow, Verdict: VerdictAllowed, Proto: "udp", Dest: netip.MustParseAddrPort("192.0.2.1:53"),
				Guest: Guest{Addr: netip.MustParseAddr("10.0.0.2"), VMID: 101}, BytesOut: 58, BytesIn: 86, PacketsOut: 1, PacketsIn: 1, Duration: time.Second})
			continue
		}
		if i%2 == 0 {
			r.Add(Record{Type: RecordDNS, Verdict: VerdictAnswered, Name: "example.org", QType: "A", Rcode: "NOERROR",
				Guest:   Guest{Addr: netip.MustParseAddr("10.0.0.2"), VMID: 101, MAC: "bc:24:11:00:00:01"},
				Answers: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}})
			continue
		}
		r.Add(Record{Type: RecordConn, Verdict: VerdictAllowed, Proto: "tcp", Dest: netip.MustParseAddrPort("192.0.2.1:443"),
			Name: "example.org", Check: "sni", BytesOut: 10, BytesIn: 20, Duration: 3 * time.Millisecond})
	}
}

// TestLogStoreRestart: the rings saved by one run are back after a
// restart for the owners kept, each under the records its ring took
// since the start (renumbered after the file's), with its counts (their
// restored part as Base); a kept owner forgotten before the save has no
// file; the files of owners not kept are removed and not read; nothing
// is saved before Restore.
func TestLogStoreRestart(t *testing.T) {
	dir := t.TempDir()
	first := NewLog(LogConfig{PerOwner: 8, Node: 64})
	st := NewLogStore(dir, first, nil)
	someRecords(first, "sbkeep", 5)
	someRecords(first, "sbgone", 3)
	someRecords(first, "sbdeleted", 2)
	someRecords(first, "zone:foreign", 2)
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("saved before Restore: %v", ents)
	}
	if err := st.Restore(nil); err != nil {
		t.Fatal(err)
	}
	first.Forget("sbdeleted")
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	files := func() []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got := files(); !slices.Equal(got, []string{"sbgone.json", "sbkeep.json"}) {
		t.Fatalf("files %v, want sbgone and sbkeep (zone: owners and forgotten ones never)", got)
	}
	before := first.Read("sbkeep", LogQuery{})
	bc, _ := first.Counts("sbkeep")

	second := NewLog(LogConfig{PerOwner: 8, Node: 64})
	st2 := NewLogStore(dir, second, nil)
	someRecords(second, "sbkeep", 2) // taken between the start and the reconcile
	if err := st2.Restore([]string{"sbkeep", "sbdeleted"}); err != nil {
		t.Fatal(err)
	}
	if got := files(); !slices.Equal(got, []string{"sbkeep.json"}) {
		t.Errorf("files after Restore %v, want sbkeep only", got)
	}
	if p := second.Read("sbgone", LogQuery{}); len(p.Records) != 0 {
		t.Errorf("an owner not kept was restored: %+v", p)
	}
	after := second.Read("sbkeep", LogQuery{})
	if !slices.Equal(seqs(after.Records), []uint64{1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("restored seqs %v", seqs(after.Records))
	}
	for i, r := range before.Records {
		if got := after.Records[i]; got.Name != r.Name || !got.Time.Equal(r.Time) || got.Dest != r.Dest || !slices.Equal(got.Answers, r.Answers) ||
			got.Guest != r.Guest || got.Duration != r.Duration || got.BytesIn != r.BytesIn {
			t.Errorf("record %d: %+v, want %+v", i, got, r)
		}
	}
	ac, _ := second.Counts("sbkeep")
	if ac.Base != bc.Now || ac.Now.Records != 7 || ac.Now.DNSAnswered != bc.Now.DNSAnswered+1 || ac.Now.BytesOut != bc.Now.BytesOut+10 {
		t.Errorf("counts after restore %+v, before %+v", ac, bc.Now)
	}
	// saved again, with the merged ring
	if err := st2.Save(); err != nil {
		t.Fatal(err)
	}
	third := NewLog(LogConfig{PerOwner: 8, Node: 64})
	if err := NewLogStore(dir, third, nil).Restore([]string{"sbkeep"}); err != nil {
		t.Fatal(err)
	}
	if p := third.Read("sbkeep", LogQuery{}); !slices.Equal(seqs(p.Records), seqs(after.Records)) {
		t.Errorf("after a second restart %v", seqs(p.Records))
	}
}

// TestLogStoreRestoreBounds: a restored ring keeps the ring's and the
// node's bounds, the file's oldest records dropped and counted.
func TestLogStoreRestoreBounds(t *testing.T) {
	dir := t.TempDir()
	big := NewLog(LogConfig{PerOwner: 10, Node: 100})
	st := NewLogStore(dir, big, nil)
	if err := st.Restore(nil); err != nil {
		t.Fatal(err)
	}
	someRecords(big, "sba", 10)
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	small := NewLog(LogConfig{PerOwner: 4, Node: 6})
	someRecords(small, "sbb", 3)
	someRecords(small, "sba", 1)
	if err := NewLogStore(dir, small, nil).Restore([]string{"sba"}); err != nil {
		t.Fatal(err)
	}
	p := small.Read("sba", LogQuery{})
	// room: the node's 6 less sbb's 3 and sba's own 1: two of the file's ten
	if !slices.Equal(seqs(p.Records), []uint64{9, 10, 11}) || p.Dropped != 8 || small.Held() != 6 {
		t.Errorf("restored %v dropped %d held %d", seqs(p.Records), p.Dropped, small.Held())
	}
}

// TestLogStoreIgnoresBadFiles: a file that does not parse, is too large,
// is a symlink, or holds something the daemon never writes is ignored
// (and removed) with a warning, and the rest restored.
func TestLogStoreIgnoresBadFiles(t *testing.T) {
	good := func() logFile {
		return logFile{Version: 1, Owner: "sbx", Counts: Counts{DNSAnswered: 1, Records: 1},
			Records: []logFileRecord{{Seq: 1, Time: time.Unix(1, 0).UTC(), Type: RecordDNS, Verdict: VerdictAnswered, Name: "a.example"}}}
	}
	enc := func(f logFile) []byte { b, _ := json.Marshal(f); return b }
	cases := []struct {
		name string
		data []byte
		link bool
	}{
		{name: "not json", data: []byte("{\"version\": 1, \"owner\": ")},
		{name: "oversized", data: append(enc(good()), bytes.Repeat([]byte(" "), 4*MaxLogRecordBytes+4096)...)},
		{name: "another version", data: enc(func() logFile { f := good(); f.Version = 2; return f }())},
		{name: "another owner", data: enc(func() logFile { f := good(); f.Owner = "sby"; return f }())},
		{name: "unknown type", data: enc(func() logFile { f := good(); f.Records[0].Type = "flow"; return f }())},
		{name: "seq past the counts", data: enc(func() logFile { f := good(); f.Records[0].Seq = 2; return f }())},
		{name: "name with a newline", data: enc(func() logFile { f := good(); f.Records[0].Name = "a\nb"; return f }())},
		{name: "too many answers", data: enc(func() logFile {
			f := good()
			for range 9 {
				f.Records[0].Answers = append(f.Records[0].Answers, "192.0.2.1")
			}
			return f
		}())},
		{name: "unknown field", data: []byte(`{"version":1,"owner":"sbx","counts":{},"records":[],"extra":1}`)},
		{name: "symlink", link: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "sbx.json")
			if tc.link {
				target := filepath.Join(t.TempDir(), "elsewhere.json")
				if err := os.WriteFile(target, enc(good()), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "sbok.json"), bytes.ReplaceAll(enc(good()), []byte(`"sbx"`), []byte(`"sbok"`)), 0o600); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			l := NewLog(LogConfig{PerOwner: 4, Node: 16})
			if err := NewLogStore(dir, l, slog.New(slog.NewTextHandler(&logs, nil))).Restore([]string{"sbx", "sbok"}); err != nil {
				t.Fatal(err)
			}
			if p := l.Read("sbx", LogQuery{}); len(p.Records) != 0 {
				t.Errorf("bad file read: %+v", p)
			}
			if p := l.Read("sbok", LogQuery{}); len(p.Records) != 1 {
				t.Errorf("the good file beside it: %+v", p)
			}
			if !strings.Contains(logs.String(), "egress record file ignored") || !strings.Contains(logs.String(), "sandbox=sbx") {
				t.Errorf("no warning: %q", logs.String())
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("bad file left: %v", err)
			}
		})
	}
}

// FuzzDecodeLogFile: whatever a file holds, the loader either refuses it
// or returns a ring that restores within its bounds: records in Seq
// order under the counts, each one the daemon could have written.
func FuzzDecodeLogFile(f *testing.F) {
	l := NewLog(LogConfig{PerOwner: 4, Node: 16})
	someRecords(l, "sbf", 3)
	l.mu.Lock()
	r := l.rings["sbf"]
	seed := logFile{Version: 1, Owner: "sbf", Counts: r.countsLocked()}
	for _, rec := range r.buf {
		seed.Records = append(seed.Records, fileRecord(rec))
	}
	l.mu.Unlock()
	b, _ := json.Marshal(seed)
	f.Add(b)
	f.Add([]byte(`{"version":1,"owner":"sbf","counts":{"Records":18446744073709551615,"DNSAnswered":18446744073709551615},"records":[]}`))
	f.Add([]byte(`{"version":1,"owner":"sbf","counts":{"Records":2},"records":[{"seq":2,"time":"2020-01-01T00:00:00Z","type":"conn","verdict":"allowed","dest":"[::1]:80"},{"seq":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		lf, err := decodeLogFile(b, "sbf")
		if err != nil {
			return
		}
		var last uint64
		for _, fr := range lf.Records {
			if fr.Seq <= last || fr.Seq > lf.Counts.Records {
				t.Fatalf("seq %d after %d of %d accepted", fr.Seq, last, lf.Counts.Records)
			}
			last = fr.Seq
			rec, err := fr.record()
			if err != nil || !knownRecord(rec.Type, rec.Verdict) || len(rec.Answers) > maxRecordAnswers || rec.BytesIn < 0 {
				t.Fatalf("record accepted: %+v %v", rec, err)
			}
		}
		l := NewLog(LogConfig{PerOwner: 4, Node: 6})
		someRecords(l, "sbo", 3)
		l.restore("sbf", lf)
		p := l.Read("sbf", LogQuery{})
		if len(p.Records) > 3 || l.Held() > 6 || p.Dropped > lf.Counts.Records {
			t.Fatalf("restored past the bounds: %d records, held %d, dropped %d", len(p.Records), l.Held(), p.Dropped)
		}
	})
}
