package egress

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Counts are what an owner's egress record counted since its instance
// began: the records by type and verdict, the bytes they carried, and
// the records made and dropped. A record is counted when it is made,
// kept in the ring or not.
type Counts struct {
	DNSAnswered, DNSRefused, DNSFailed   uint64
	ConnAllowed, ConnRefused, ConnFailed uint64
	// Flows counts the kernel's flows recorded (RecordFlow, allowed:
	// the packets the guard dropped, refused flow records, are in
	// Records only, and their bytes in neither BytesOut nor BytesIn).
	Flows             uint64
	BytesOut, BytesIn uint64
	Records, Dropped  uint64
}

// add counts rec (Records and Dropped are the ring's seq and dropped).
func (c *Counts) add(rec Record) {
	switch rec.Type {
	case RecordDNS:
		switch rec.Verdict {
		case VerdictAnswered:
			c.DNSAnswered++
		case VerdictRefused:
			c.DNSRefused++
		case VerdictFailed:
			c.DNSFailed++
		}
	case RecordConn:
		switch rec.Verdict {
		case VerdictAllowed:
			c.ConnAllowed++
		case VerdictRefused:
			c.ConnRefused++
		case VerdictFailed:
			c.ConnFailed++
		}
	case RecordFlow:
		if rec.Verdict == VerdictRefused {
			return // the guard dropped it (KernelDrops): no flow left, no byte went out
		}
		c.Flows++
	}
	c.BytesOut += uint64(max(rec.BytesOut, 0))
	c.BytesIn += uint64(max(rec.BytesIn, 0))
}

// plus is c and o summed.
func (c Counts) plus(o Counts) Counts {
	return Counts{DNSAnswered: c.DNSAnswered + o.DNSAnswered, DNSRefused: c.DNSRefused + o.DNSRefused, DNSFailed: c.DNSFailed + o.DNSFailed,
		ConnAllowed: c.ConnAllowed + o.ConnAllowed, ConnRefused: c.ConnRefused + o.ConnRefused, ConnFailed: c.ConnFailed + o.ConnFailed, Flows: c.Flows + o.Flows,
		BytesOut: c.BytesOut + o.BytesOut, BytesIn: c.BytesIn + o.BytesIn, Records: c.Records + o.Records, Dropped: c.Dropped + o.Dropped}
}

// LogCounts are an owner's counts as Log.Counts reads them.
type LogCounts struct {
	// Gen names the ring's instance: a new instance (the sandbox deleted
	// and its id reused, a pool member claimed) has another.
	Gen uint64
	// Now are the counts of the instance so far; Base the part of them
	// restored from a previous run of the daemon (LogStore.Restore), so
	// a reader of the increments (the egress events) starts from Base.
	Now, Base Counts
}

// newRingLocked makes owner's ring, a new instance; call with l.mu held.
func (l *Log) newRingLocked(owner string) *Ring {
	l.gens++
	r := &Ring{log: l, owner: owner, gen: l.gens}
	l.rings[owner] = r
	return r
}

// countsLocked are r's counts; call with log.mu held.
func (r *Ring) countsLocked() Counts {
	c := r.tally
	c.Records, c.Dropped = r.seq, r.dropped
	return c
}

// Counts returns owner's counts; false when it has no ring (nothing
// recorded of its instance yet, or forgotten).
func (l *Log) Counts(owner string) (LogCounts, bool) {
	if l == nil {
		return LogCounts{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[owner]
	if r == nil {
		return LogCounts{}, false
	}
	return LogCounts{Gen: r.gen, Now: r.countsLocked(), Base: r.base}, true
}

// Collector exports the record's per-owner counters, read from the
// rings at scrape time: an owner's series exist while its ring does and
// go with it (Forget), so their number is bounded by the owners the
// node holds (the node's sandboxes and the zones it did not create).
func (l *Log) Collector() prometheus.Collector { return logCollector{l} }

var (
	logBytesDesc = prometheus.NewDesc("pve_inspect_egress_record_bytes_total",
		"Bytes of the sandbox's recorded connections (payload relayed by the proxy) and flows (IP bytes, headers included, as conntrack counts them) (sandbox: zone:<id> for zones the daemon did not create), by direction (out: guest to destination; in: back), since its instance began; kept across daemon restarts with the record.",
		[]string{"sandbox", "direction"}, nil)
	logRecordsDesc = prometheus.NewDesc("pve_inspect_egress_records_total",
		"Records of the sandbox's egress record made (DNS questions, proxied connections and kernel flows), since its instance began.",
		[]string{"sandbox"}, nil)
	logDroppedDesc = prometheus.NewDesc("pve_inspect_egress_records_dropped_total",
		"Records of the sandbox's egress record dropped (its ring full, or the node's bound reached), since its instance began.",
		[]string{"sandbox"}, nil)
)

type logCollector struct{ l *Log }

// Describe implements prometheus.Collector.
func (c logCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- logBytesDesc
	ch <- logRecordsDesc
	ch <- logDroppedDesc
}

// Collect implements prometheus.Collector: the counts are copied under
// the record's lock and sent after it is released, so a slow scrape
// never holds up the resolver or the proxy.
func (c logCollector) Collect(ch chan<- prometheus.Metric) {
	type owned struct {
		owner string
		c     Counts
	}
	c.l.mu.Lock()
	all := make([]owned, 0, len(c.l.rings))
	for o, r := range c.l.rings {
		all = append(all, owned{o, r.countsLocked()})
	}
	c.l.mu.Unlock()
	for _, o := range all {
		ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.CounterValue, float64(o.c.BytesOut), o.owner, "out")
		ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.CounterValue, float64(o.c.BytesIn), o.owner, "in")
		ch <- prometheus.MustNewConstMetric(logRecordsDesc, prometheus.CounterValue, float64(o.c.Records), o.owner)
		ch <- prometheus.MustNewConstMetric(logDroppedDesc, prometheus.CounterValue, float64(o.c.Dropped), o.owner)
	}
}
