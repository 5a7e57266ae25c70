package apitype

import "time"

// EgressPolicy is a sandbox's egress policy (DESIGN.md section 10).
type EgressPolicy struct {
	// Mode is "open" (default), "allowlist" or "none".
	Mode string `json:"mode"`
	// Allow lists exact domains, wildcard domains ("*.example.org"),
	// either with a tcp port ("github.com:22"), IPv4 addresses and CIDRs;
	// allowlist mode only. A domain opens tcp 80/443 of its addresses
	// through the Host/SNI check, a domain:port that port by address
	// alone (unchecked), a CIDR everything.
	Allow []string `json:"allow,omitempty"`
	// Deny lists IPv4 addresses and CIDRs never reachable, in any mode.
	Deny []string `json:"deny,omitempty"`
}

// EgressDenial is one refused name or connection.
type EgressDenial struct {
	Time time.Time `json:"time"`
	// Reason is name, mode, sni, host, peek, address or quota.
	Reason string `json:"reason"`
	// Name is the refused DNS name, Host or SNI, when there is one.
	Name string `json:"name,omitempty"`
	// Dest is the destination: address:port for a refused connection, the
	// address alone for reason address (a kernel drop, counted per packet).
	Dest string `json:"dest,omitempty"`
}

// EgressStatus is a sandbox's policy in force and its recent denials.
type EgressStatus struct {
	Sandbox string         `json:"sandbox"`
	Policy  EgressPolicy   `json:"policy"`
	Denials []EgressDenial `json:"denials"`
}

// EgressRecord is one entry of a sandbox's egress record (GET
// .../egress/log): a DNS question the node's resolver answered or a
// connection its proxy handled, written by the daemon only. No payload
// is recorded.
type EgressRecord struct {
	// Seq numbers the sandbox's records from 1 (a gap: records dropped).
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type is dns, conn or flow (a flow the kernel's conntrack saw
	// leave the zone, in every egress mode).
	Type string `json:"type"`
	// VM and VMID name the VM the guest address belongs to (the guard's
	// port map), MAC its NIC; Source is the guest address.
	VM     string `json:"vm,omitempty"`
	VMID   int    `json:"vmid,omitempty"`
	MAC    string `json:"mac,omitempty"`
	Source string `json:"source,omitempty"`
	// Verdict is answered (dns), allowed (conn, flow), refused or failed;
	// Reason says why (a denial reason: name, mode, sni, host, peek,
	// address, quota; or upstream, stale, connect, learn, zone).
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	// Name is the DNS question, or the name a connection was checked as
	// (its TLS SNI or HTTP Host) when the proxy saw one. A question past
	// 253 characters (only escaped bytes, \DDD, make one) is cut to at
	// most 250, between two characters, and marked "…".
	Name string `json:"name,omitempty"`
	// QType, Rcode and Answers are a question's type, its answer's code
	// and the addresses given (at most 8).
	QType   string   `json:"qtype,omitempty"`
	Rcode   string   `json:"rcode,omitempty"`
	Answers []string `json:"answers,omitempty"`
	// Proto, Dest and Check are a connection's protocol, destination
	// (address:port; the address alone, and no protocol, for a refused
	// flow: packets the guard dropped, counted by address) and how its
	// name was seen (sni or host).
	Proto string `json:"proto,omitempty"`
	Dest  string `json:"dest,omitempty"`
	Check string `json:"check,omitempty"`
	// BytesOut and BytesIn are the bytes relayed guest to destination
	// and back (conn: payload; flow: IP bytes, headers included, as
	// conntrack counts them, or for a refused flow as the guard's set
	// counted what it dropped; absent: none); DurationMS from accept to
	// close (flow: from its first packet to its end in conntrack).
	BytesOut   int64 `json:"bytes_out,omitempty"`
	BytesIn    int64 `json:"bytes_in,omitempty"`
	DurationMS int64 `json:"duration_ms,omitempty"`
	// PacketsOut and PacketsIn are the packets of a flow each way (a
	// refused flow: the packets dropped since the previous read of the
	// guard's counters, every two seconds).
	PacketsOut int64 `json:"packets_out,omitempty"`
	PacketsIn  int64 `json:"packets_in,omitempty"`
}

// EgressLog is the body of GET /v1/sandboxes/{id}/egress/log: a page of
// the sandbox's egress record, oldest first.
type EgressLog struct {
	Sandbox string         `json:"sandbox"`
	Records []EgressRecord `json:"records"`
	// Dropped counts the sandbox's records dropped so far (its ring
	// full, or the node's bound reached).
	Dropped uint64 `json:"dropped"`
	// Next is the since of the next page; More is true when records
	// past it match.
	Next uint64 `json:"next"`
	More bool   `json:"more"`
}

// EgressCounts are what a sandbox's egress record counted over a span
// (an egress event: since the sandbox's previous one): DNS questions by
// verdict, connections by verdict, the bytes they carried each way, and
// the records made and dropped (a dropped record is counted too).
type EgressCounts struct {
	DNSAnswered uint64 `json:"dns_answered"`
	DNSRefused  uint64 `json:"dns_refused"`
	DNSFailed   uint64 `json:"dns_failed"`
	ConnAllowed uint64 `json:"conn_allowed"`
	ConnRefused uint64 `json:"conn_refused"`
	ConnFailed  uint64 `json:"conn_failed"`
	// Flows counts the kernel's flows recorded (type flow, allowed; a
	// refused flow, packets the guard dropped, counts in records only,
	// its bytes in neither bytes_out nor bytes_in).
	Flows    uint64 `json:"flows"`
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
	Records  uint64 `json:"records"`
	Dropped  uint64 `json:"dropped"`
	// Seq is the sandbox's newest record's seq when the counts were
	// taken: read the records counted with since set to the previous
	// event's Seq.
	Seq uint64 `json:"seq"`
}

// EgressLogQuery selects records of GET .../egress/log.
type EgressLogQuery struct {
	// Type is dns, conn or flow ("": all).
	Type string
	// VM is a VM name of the sandbox ("": all).
	VM string
	// Since returns the records after this Seq.
	Since uint64
	// Limit is the most records returned (0: the server's default).
	Limit int
}
