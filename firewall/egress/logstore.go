package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// logFileVersion is the version of a persisted ring.
const logFileVersion = 1

// MaxLogRecordBytes bounds one record in a persisted ring: a file of a
// ring of n records larger than n times this (plus a header) is not
// read. A record's JSON is under 1 KiB at worst (a 253-character name,
// eight IPv6 answers).
const MaxLogRecordBytes = 1024

// logFile is the on-disk form of one owner's ring, versioned apart from
// Record and the API's types.
type logFile struct {
	Version int    `json:"version"`
	Owner   string `json:"owner"`
	// Counts are the ring's counts (Records is its last Seq, Dropped its
	// dropped).
	Counts  Counts          `json:"counts"`
	Records []logFileRecord `json:"records"`
}

type logFileRecord struct {
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	Type       string    `json:"type"`
	Addr       string    `json:"addr,omitempty"`
	VMID       int       `json:"vmid,omitempty"`
	MAC        string    `json:"mac,omitempty"`
	Verdict    string    `json:"verdict"`
	Reason     string    `json:"reason,omitempty"`
	Name       string    `json:"name,omitempty"`
	QType      string    `json:"qtype,omitempty"`
	Rcode      string    `json:"rcode,omitempty"`
	Answers    []string  `json:"answers,omitempty"`
	Proto      string    `json:"proto,omitempty"`
	Dest       string    `json:"dest,omitempty"`
	Check      string    `json:"check,omitempty"`
	BytesOut   int64     `json:"bytes_out,omitempty"`
	BytesIn    int64     `json:"bytes_in,omitempty"`
	DurationNS int64     `json:"duration_ns,omitempty"`
	PacketsOut int64     `json:"packets_out,omitempty"`
	PacketsIn  int64     `json:"packets_in,omitempty"`
}

// LogStore keeps the egress record on disk so that it survives a restart
// of the daemon while its sandbox lives: one file per owner, named by
// the owner (a sandbox id; owners that are not, such as zone:<id>, are
// not kept), holding its ring (at most PerOwner records, so a file is at
// most PerOwner times MaxLogRecordBytes). Save writes the rings changed
// since the last save, each file atomically, and removes the files of
// owners forgotten since; nothing is saved before Restore, which runs
// once, after the engine's reconcile: it reads the files of the
// sandboxes the engine still has, merges each under the records its ring
// took since the start, and removes every other file. A file that does
// not parse, is too large, or holds a record that is not one the daemon
// writes is ignored (logged) and removed, never half-read.
type LogStore struct {
	dir string
	l   *Log
	log *slog.Logger

	// mu serializes Save and Restore (the disk is theirs); taken before
	// l.mu.
	mu       sync.Mutex
	restored bool
}

// NewLogStore returns the store of l's rings in dir (made if missing).
func NewLogStore(dir string, l *Log, log *slog.Logger) *LogStore {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LogStore{dir: dir, l: l, log: log.With("component", "egress")}
}

// storableOwner reports whether owner can name a file: a sandbox id.
func storableOwner(owner string) bool {
	if owner == "" || len(owner) > 64 || owner[0] == '-' {
		return false
	}
	for _, c := range owner {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (s *LogStore) path(owner string) string { return filepath.Join(s.dir, owner+".json") }

// maxFileBytes bounds a persisted ring's file.
func (s *LogStore) maxFileBytes() int64 { return int64(s.l.perOwner)*MaxLogRecordBytes + 4096 }

// Restore reads the persisted rings of the owners in keep (the sandboxes
// the engine has after its reconcile) into the record, each under the
// records its ring took since the start (theirs renumbered after the
// file's), and removes the files of every other owner; from then on Save
// writes. Only the first call does anything.
func (s *LogStore) Restore(keep []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.restored {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("egress record store: %w", err)
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("egress record store: %w", err)
	}
	kept := map[string]bool{}
	for _, o := range keep {
		kept[o] = true
	}
	var errs []error
	for _, e := range ents {
		owner, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !storableOwner(owner) {
			continue // not a ring's file (an interrupted write's temporary file is the next write's to replace)
		}
		if kept[owner] {
			f, err := s.load(owner)
			if err == nil {
				s.l.restore(owner, f)
				continue
			}
			s.log.Warn("egress record file ignored", "sandbox", owner, "err", err)
		}
		if err := os.Remove(s.path(owner)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	s.restored = true
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("egress record store: %w", err)
	}
	return nil
}

// load reads and checks owner's file.
func (s *LogStore) load(owner string) (logFile, error) {
	f, err := os.OpenFile(s.path(owner), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return logFile{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return logFile{}, err
	}
	if !st.Mode().IsRegular() {
		return logFile{}, fmt.Errorf("%s: not a regular file", f.Name())
	}
	limit := s.maxFileBytes()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return logFile{}, err
	}
	if int64(len(b)) > limit {
		return logFile{}, fmt.Errorf("%s: larger than %d bytes", f.Name(), limit)
	}
	return decodeLogFile(b, owner)
}

// decodeLogFile parses and checks a persisted ring of owner: every field
// within what the daemon writes, the records in Seq order under the
// counts.
func decodeLogFile(b []byte, owner string) (logFile, error) {
	var f logFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return logFile{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return logFile{}, errors.New("parse: data after the ring")
	}
	switch {
	case f.Version != logFileVersion:
		return logFile{}, fmt.Errorf("version %d, want %d", f.Version, logFileVersion)
	case f.Owner != owner:
		return logFile{}, fmt.Errorf("owner %q in the file of %q", f.Owner, owner)
	case f.Counts.Records > maxFileCount || f.Counts.Dropped > f.Counts.Records || uint64(len(f.Records)) > f.Counts.Records:
		return logFile{}, fmt.Errorf("counts %d records, %d dropped, for %d kept", f.Counts.Records, f.Counts.Dropped, len(f.Records))
	}
	c := f.Counts
	var byVerdict uint64
	for _, n := range []uint64{c.DNSAnswered, c.DNSRefused, c.DNSFailed, c.ConnAllowed, c.ConnRefused, c.ConnFailed, c.Flows} {
		if n > c.Records {
			return logFile{}, fmt.Errorf("counts by verdict past %d records", c.Records)
		}
		byVerdict += n // at most 7 times maxFileCount: no overflow
	}
	if byVerdict > c.Records {
		return logFile{}, fmt.Errorf("counts by verdict past %d records", c.Records)
	}
	var last uint64
	for i, r := range f.Records {
		if r.Seq <= last || r.Seq > f.Counts.Records {
			return logFile{}, fmt.Errorf("record %d: seq %d after %d (of %d)", i, r.Seq, last, f.Counts.Records)
		}
		last = r.Seq
		if _, err := r.record(); err != nil {
			return logFile{}, fmt.Errorf("record %d: %w", i, err)
		}
	}
	return f, nil
}

// maxFileCount bounds a persisted count (2^53: a record a nanosecond for
// a hundred days and more), so that sums of counts never overflow.
const maxFileCount = 1 << 53

// Bounds of a persisted record's strings.
const (
	maxNameChars  = 255 // a DNS name (253), a Host or SNI
	maxTokenChars = 32  // reason, qtype, rcode, proto, check
)

// knownRecord reports whether typ and verdict are a record the daemon
// writes.
func knownRecord(typ, verdict string) bool {
	switch typ {
	case RecordDNS:
		return verdict == VerdictAnswered || verdict == VerdictRefused || verdict == VerdictFailed
	case RecordConn:
		return verdict == VerdictAllowed || verdict == VerdictRefused || verdict == VerdictFailed
	case RecordFlow:
		return verdict == VerdictAllowed
	}
	return false
}

// record is r as a Record, or why it is not one the daemon writes.
func (r logFileRecord) record() (Record, error) {
	out := Record{Seq: r.Seq, Time: r.Time, Type: r.Type, Guest: Guest{VMID: r.VMID, MAC: r.MAC}, Verdict: r.Verdict, Reason: r.Reason,
		Name: r.Name, QType: r.QType, Rcode: r.Rcode, Proto: r.Proto, Check: r.Check,
		BytesOut: r.BytesOut, BytesIn: r.BytesIn, Duration: time.Duration(r.DurationNS), PacketsOut: r.PacketsOut, PacketsIn: r.PacketsIn}
	switch {
	case !knownRecord(r.Type, r.Verdict):
		return Record{}, fmt.Errorf("type %q verdict %q", r.Type, r.Verdict)
	case r.Time.IsZero():
		return Record{}, errors.New("no time")
	case len(r.Name) > maxNameChars || !printable(r.Name):
		return Record{}, errors.New("name not one a check takes")
	case r.VMID < 0 || r.VMID > 999999999 || r.BytesOut < 0 || r.BytesIn < 0 || r.DurationNS < 0 || r.PacketsOut < 0 || r.PacketsIn < 0:
		return Record{}, errors.New("negative or out-of-range number")
	case len(r.Answers) > maxRecordAnswers:
		return Record{}, fmt.Errorf("%d answers, at most %d", len(r.Answers), maxRecordAnswers)
	}
	for _, t := range []string{r.Reason, r.QType, r.Rcode, r.Proto, r.Check} {
		if len(t) > maxTokenChars || !printable(t) {
			return Record{}, fmt.Errorf("field %q not a token", t)
		}
	}
	if r.MAC != "" {
		if len(r.MAC) != 17 || !printable(r.MAC) {
			return Record{}, fmt.Errorf("mac %q", r.MAC)
		}
	}
	var err error
	if r.Addr != "" {
		if out.Guest.Addr, err = netip.ParseAddr(r.Addr); err != nil {
			return Record{}, err
		}
	}
	if r.Dest != "" {
		if out.Dest, err = netip.ParseAddrPort(r.Dest); err != nil {
			return Record{}, err
		}
	}
	for _, a := range r.Answers {
		ad, err := netip.ParseAddr(a)
		if err != nil {
			return Record{}, err
		}
		out.Answers = append(out.Answers, ad)
	}
	return out, nil
}

// printable reports whether s is printable ASCII.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// fileRecord is rec as the file keeps it.
func fileRecord(rec Record) logFileRecord {
	out := logFileRecord{Seq: rec.Seq, Time: rec.Time, Type: rec.Type, VMID: rec.Guest.VMID, MAC: rec.Guest.MAC, Verdict: rec.Verdict,
		Reason: rec.Reason, Name: rec.Name, QType: rec.QType, Rcode: rec.Rcode, Proto: rec.Proto, Check: rec.Check,
		BytesOut: rec.BytesOut, BytesIn: rec.BytesIn, DurationNS: int64(rec.Duration), PacketsOut: rec.PacketsOut, PacketsIn: rec.PacketsIn}
	if rec.Guest.Addr.IsValid() {
		out.Addr = rec.Guest.Addr.String()
	}
	if rec.Dest.IsValid() {
		out.Dest = rec.Dest.String()
	}
	for _, a := range rec.Answers {
		out.Answers = append(out.Answers, a.String())
	}
	return out
}

// restore merges f into owner's ring: the file's records first, the
// ring's own (taken since the start) renumbered after them, at most the
// ring's and the node's room (the file's oldest dropped, counted).
func (l *Log) restore(owner string, f logFile) {
	recs := make([]Record, 0, len(f.Records))
	for _, fr := range f.Records {
		if r, err := fr.record(); err == nil {
			recs = append(recs, r)
		}
	}
	c := f.Counts
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[owner]
	if r == nil {
		r = l.newRingLocked(owner)
	}
	live := make([]Record, 0, len(r.buf))
	for i := range r.buf {
		rec := r.buf[(r.head+i)%len(r.buf)]
		rec.Seq += c.Records
		live = append(live, rec)
	}
	room := max(min(l.perOwner-len(live), l.node-l.total), 0)
	if len(recs) > room {
		c.Dropped += uint64(len(recs) - room)
		recs = recs[len(recs)-room:]
	}
	r.buf, r.head = append(recs, live...), 0
	l.total += len(recs)
	r.seq += c.Records
	r.dropped += c.Dropped
	r.base = r.base.plus(c)
	c.Records, c.Dropped = 0, 0
	r.tally = r.tally.plus(c)
	l.dirty[owner] = struct{}{}
}

// Save writes the rings changed since the last save and removes the
// files of the owners forgotten since (nothing before Restore). A ring
// that could not be written is tried again at the next save.
func (s *LogStore) Save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.restored {
		return nil
	}
	type snap struct {
		owner string
		f     *logFile // nil: remove
	}
	l := s.l
	l.mu.Lock()
	var snaps []snap
	for o := range l.dirty {
		delete(l.dirty, o)
		if !storableOwner(o) {
			continue
		}
		r := l.rings[o]
		if r == nil {
			snaps = append(snaps, snap{owner: o})
			continue
		}
		f := &logFile{Version: logFileVersion, Owner: o, Counts: r.countsLocked(), Records: make([]logFileRecord, 0, len(r.buf))}
		for i := range r.buf {
			f.Records = append(f.Records, fileRecord(r.buf[(r.head+i)%len(r.buf)]))
		}
		snaps = append(snaps, snap{owner: o, f: f})
	}
	l.mu.Unlock()
	slices.SortFunc(snaps, func(a, b snap) int { return strings.Compare(a.owner, b.owner) })
	var errs []error
	for _, sn := range snaps {
		err := s.write(sn.owner, sn.f)
		if err != nil {
			errs = append(errs, err)
			l.mu.Lock()
			l.dirty[sn.owner] = struct{}{}
			l.mu.Unlock()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("egress record store: %w", err)
	}
	return nil
}

// write replaces owner's file with f, or removes it (f nil).
func (s *LogStore) write(owner string, f *logFile) error {
	if f == nil {
		if err := os.Remove(s.path(owner)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s: %w", owner, err)
	}
	return atomicfile.Write(s.path(owner), b, 0o600)
}
