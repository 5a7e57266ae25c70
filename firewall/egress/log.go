package egress

import (
	"net/netip"
	"sync"
	"time"
)

// Types of a Record.
const (
	RecordDNS  = "dns"  // a DNS question the resolver answered
	RecordConn = "conn" // a connection the proxy handled
	RecordFlow = "flow" // a flow the kernel's conntrack saw leave the zone (Flows), or packets the guard dropped (KernelDrops)
)

// Verdicts of a Record.
const (
	VerdictAnswered = "answered" // DNS: answered (NOERROR with or without data, or upstream's NXDOMAIN)
	VerdictAllowed  = "allowed"  // conn: spliced to its destination; flow: let out by the guard
	VerdictRefused  = "refused"  // refused by the policy or a quota (Reason says which)
	VerdictFailed   = "failed"   // allowed, but it could not be served (Reason says why)
)

// Reasons of a failed Record (the refusals use the denial reasons).
const (
	ReasonUpstream = "upstream" // DNS: the upstream resolver failed
	ReasonStale    = "stale"    // the policy changed while it was served
	ReasonConnect  = "connect"  // conn: the destination did not accept
	ReasonLearn    = "learn"    // DNS: the guard did not take the answer's addresses
	ReasonZone     = "zone"     // DNS: a zone-local name (the zone's dnsmasq's, or a VM name of the sandbox the resolver answers)
)

// maxRecordAnswers bounds the answer addresses kept in one Record.
const maxRecordAnswers = 8

// maxRecordName bounds the bytes of a Record's Name: a DNS name of
// valid syntax (at most 253 characters) is kept whole; a question's name
// in presentation form can be four times that (each octet outside
// printable ASCII is \DDD), and such a name is cut (recordName).
const maxRecordName = 253

// recordName is name as a Record keeps it: whole when it fits
// maxRecordName, else its longest prefix of whole characters (a byte,
// \X or \DDD: never a part of an escape) that fits with the ellipsis
// marking the cut, which no name in presentation form has (miekg/dns
// escapes every byte outside printable ASCII).
func recordName(name string) string {
	if len(name) <= maxRecordName {
		return name
	}
	const mark = "…"
	keep := 0
	for keep < len(name) {
		n := 1
		if name[keep] == '\\' {
			n = 2
			if keep+1 < len(name) && name[keep+1] >= '0' && name[keep+1] <= '9' {
				n = 4
			}
		}
		if keep+n > maxRecordName-len(mark) {
			break
		}
		keep += n
	}
	return name[:keep] + mark
}

// Guest is a guest as the node knows it: the address a record came
// from and, when the layer-2 table maps it, the VM and MAC of its port.
type Guest struct {
	Addr netip.Addr
	VMID int
	MAC  string
}

// Guests names the guest behind a source address (the guard's port
// map: the address it pins to a VM's port).
type Guests interface {
	GuestOf(a netip.Addr) (Guest, bool)
}

// Record is one entry of a sandbox's egress record: a DNS question, a
// connection or a kernel flow, never a byte of payload.
type Record struct {
	// Seq numbers the owner's records from 1, in the order they were
	// recorded (a gap is a record dropped).
	Seq  uint64
	Time time.Time
	Type string
	// Guest is where it came from.
	Guest Guest
	// Verdict is one of the Verdict constants; Reason why (a denial
	// reason, or a failure reason).
	Verdict, Reason string
	// Name is the DNS question (RecordDNS) or the name the connection
	// was checked as (RecordConn: its TLS SNI or HTTP Host, when seen).
	Name string
	// QType and Rcode are the question's type and the answer's code;
	// Answers the addresses the guest was given (at most 8).
	QType, Rcode string
	Answers      []netip.Addr
	// Proto, Dest and Check are a connection's or flow's protocol,
	// original destination, and how its name was seen ("sni" or "host";
	// never for a flow). A refused flow (KernelDrops) has no Proto and
	// port 0: the guard's set keys by interface and address alone.
	Proto string
	Dest  netip.AddrPort
	Check string
	// BytesOut and BytesIn are the payload bytes relayed guest to
	// destination and back (RecordConn), or the IP bytes (headers
	// included) conntrack counted in each direction (RecordFlow; of a
	// refused one, BytesOut is the IP bytes the guard dropped);
	// Duration is from accept to close (RecordConn), or from the flow's
	// first packet to its end in conntrack (RecordFlow: for TCP, after
	// the timeout of the state it closed in, TIME_WAIT or CLOSE_WAIT,
	// so up to a minute past its last packet with the kernel's
	// defaults).
	BytesOut, BytesIn int64
	Duration          time.Duration
	// PacketsOut and PacketsIn are the packets conntrack counted each
	// way (RecordFlow only; of a refused one, PacketsOut is the packets
	// the guard dropped to Dest since KernelDrops' previous read).
	PacketsOut, PacketsIn int64
}

// LogConfig bounds the egress record.
type LogConfig struct {
	// PerOwner is the records kept per owner (a ring: past it the oldest
	// goes). Zero means DefaultLogEntries.
	PerOwner int
	// Node is the records kept of all owners; past it an owner's new
	// record is dropped unless its ring is full (then its own oldest
	// goes), so one owner's flood never evicts another's records. Zero
	// means PerOwner times DefaultOwners.
	Node int
}

// DefaultLogEntries is the records kept per owner when a config leaves
// it out.
const DefaultLogEntries = 2048

// Log is the egress record of every owner (a sandbox, or a zone the
// daemon did not create): a ring per owner, written only by the
// daemon's resolver, proxy and conntrack reader (Flows), so a guest can
// neither forge nor erase an entry. What it holds of an owner is
// dropped with the owner's instance (Forget, from Registry.OnDrop): a
// ring taken before that (Open) takes no more records, and a new
// instance starts empty.
type Log struct {
	perOwner, node int
	now            func() time.Time

	mu    sync.Mutex // guards rings, total and every Ring's fields
	rings map[string]*Ring
	total int // records held in all rings
	// gens numbers the rings made (Ring.gen); dirty holds the owners
	// whose ring changed or went since the last save (LogStore).
	gens  uint64
	dirty map[string]struct{}
	// forgets counts the instances forgotten (Flows sweeps its followed
	// flows of them when this changed).
	forgets uint64
}

// Ring is one owner's records (of one instance of it).
type Ring struct {
	log *Log
	// guarded by log.mu
	buf     []Record // oldest at head once full
	head    int
	seq     uint64
	dropped uint64
	gone    bool
	// owner and gen name the ring's instance; tally counts what it
	// recorded, base the part of tally restored from disk (logcount.go).
	owner       string
	gen         uint64
	tally, base Counts
}

// NewLog returns an empty record bounded by cfg.
func NewLog(cfg LogConfig) *Log {
	if cfg.PerOwner <= 0 {
		cfg.PerOwner = DefaultLogEntries
	}
	if cfg.Node <= 0 {
		cfg.Node = cfg.PerOwner * DefaultOwners
	}
	return &Log{perOwner: cfg.PerOwner, node: cfg.Node, now: time.Now, rings: map[string]*Ring{}, dirty: map[string]struct{}{}}
}

// Open returns owner's ring, made if it has none. A nil Log returns a
// nil Ring, which records nothing. Call it while owner's instance is
// known current (under Registry.IfCurrent or IfInstance), so that no ring
// is made for an instance already forgotten.
func (l *Log) Open(owner string) *Ring {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[owner]
	if r == nil {
		r = l.newRingLocked(owner)
	}
	return r
}

// Add records rec (its Seq and, if zero, its Time set here). A ring of a
// forgotten instance, or a nil one, records nothing.
func (r *Ring) Add(rec Record) { r.add(rec) }

// AddFlow records a RecordFlow as Add does and reports whether the ring
// took it (false: a nil ring, or one of a forgotten instance; a record
// past a bound is taken, and counted as dropped).
func (r *Ring) AddFlow(rec Record) bool {
	rec.Type = RecordFlow
	return r.add(rec)
}

func (r *Ring) add(rec Record) bool {
	if r == nil {
		return false
	}
	l := r.log
	now := l.now().UTC()
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.gone {
		return false
	}
	r.seq++
	rec.Seq = r.seq
	if rec.Time.IsZero() {
		rec.Time = now
	}
	r.tally.add(rec)
	l.dirty[r.owner] = struct{}{}
	switch {
	case len(r.buf) == l.perOwner:
		r.buf[r.head] = rec // its own oldest goes
		r.head = (r.head + 1) % len(r.buf)
		r.dropped++
	case l.total >= l.node:
		r.dropped++ // the node is full: never another owner's record
	default:
		r.buf = append(r.buf, rec)
		l.total++
	}
	return true
}

// dropOne counts one record of r dropped before it was made (a flow not
// followed past a bound, Flows.follow): its seq moves on, so that a
// reader sees the gap, and dropped counts it. A nil ring, or one of a
// forgotten instance, counts nothing.
func (r *Ring) dropOne() {
	if r == nil {
		return
	}
	l := r.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.gone {
		return
	}
	r.seq++
	r.dropped++
	l.dirty[r.owner] = struct{}{}
}

// Forget drops owner's records (its instance ended); a ring taken of it
// before records nothing more.
func (l *Log) Forget(owner string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.endLocked(owner); r != nil {
		l.total -= len(r.buf)
		r.buf = nil
	}
}

// Take ends owner's instance as Forget does, and hands over what its ring
// held instead of dropping it (nil: it had no ring): the ring leaves the
// Log at once (no read, count or save finds it, a ring taken of it before
// records nothing more, a new instance starts empty), but its records
// stay counted in the node's bound until the Taken is released, so that
// what is handed over, while it is written out, is still within the
// bound. The records are not copied.
func (l *Log) Take(owner string) *Taken {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.endLocked(owner)
	if r == nil {
		return nil
	}
	t := &Taken{log: l, buf: r.buf, head: r.head, Dropped: r.dropped}
	r.buf = nil // the ring is gone: nothing writes to buf any more
	return t
}

// endLocked ends owner's ring, if it has one, and returns it: it takes no
// more records and leaves the Log, its file goes at the next save; its
// records are still counted in total. Call with l.mu held.
func (l *Log) endLocked(owner string) *Ring {
	r := l.rings[owner]
	if r == nil {
		return nil
	}
	r.gone = true
	delete(l.rings, owner)
	l.dirty[owner] = struct{}{}
	l.forgets++
	return r
}

// Taken is an owner's whole record as Take handed it over: every record
// its ring held, oldest first, and the count of those dropped. A nil
// Taken holds nothing.
type Taken struct {
	log  *Log
	buf  []Record // oldest at head once the ring was full
	head int
	// Dropped counts the owner's records dropped (ring or node bound).
	Dropped uint64
	once    sync.Once
}

// Len returns the records held.
func (t *Taken) Len() int {
	if t == nil {
		return 0
	}
	return len(t.buf)
}

// Last returns the newest record's Seq (0: none held).
func (t *Taken) Last() uint64 {
	if t.Len() == 0 {
		return 0
	}
	return t.buf[(t.head+len(t.buf)-1)%len(t.buf)].Seq
}

// Each calls fn with each record, oldest first, and stops at the first
// error fn returns, which it returns.
func (t *Taken) Each(fn func(Record) error) error {
	for i := range t.Len() {
		if err := fn(t.buf[(t.head+i)%len(t.buf)]); err != nil {
			return err
		}
	}
	return nil
}

// Release gives the records' room back to the node's bound; call it once
// they are written out (again: nothing). Each holds nothing after it.
func (t *Taken) Release() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		t.log.mu.Lock()
		defer t.log.mu.Unlock()
		t.log.total -= len(t.buf)
		t.buf = nil
	})
}

// current returns owner's ring (nil: it has none), making none.
func (l *Log) current(owner string) *Ring {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rings[owner]
}

// lastGen is the Gen of the newest ring made so far.
func (l *Log) lastGen() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gens
}

// LogQuery selects records of one owner.
type LogQuery struct {
	// Type is RecordDNS, RecordConn or RecordFlow; "" all.
	Type string
	// VMID selects one VM's records (0: all).
	VMID int
	// Since returns only records with a larger Seq.
	Since uint64
	// Limit is the most records returned (0: all).
	Limit int
}

// LogPage is an answer of Read.
type LogPage struct {
	Records []Record
	// Dropped counts the owner's records dropped so far (ring or node
	// bound).
	Dropped uint64
	// Next is the Since of the next page: the Seq of the last record
	// returned (the query's Since when none is).
	Next uint64
	// More is true when records past Next match.
	More bool
}

// Read returns owner's records matching q, oldest first.
func (l *Log) Read(owner string, q LogQuery) LogPage {
	page := LogPage{Records: []Record{}, Next: q.Since}
	if l == nil {
		return page
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[owner]
	if r == nil {
		return page
	}
	page.Dropped = r.dropped
	for i := range r.buf {
		rec := r.buf[(r.head+i)%len(r.buf)]
		if rec.Seq <= q.Since || q.Type != "" && rec.Type != q.Type || q.VMID != 0 && rec.Guest.VMID != q.VMID {
			continue
		}
		if q.Limit > 0 && len(page.Records) == q.Limit {
			page.More = true
			break
		}
		rec.Answers = append([]netip.Addr(nil), rec.Answers...)
		page.Records = append(page.Records, rec)
		page.Next = rec.Seq
	}
	return page
}

// Held returns the records held of all owners.
func (l *Log) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
