package firewall

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumper reads rules and set elements of the guard's tables over a
// netlink socket of its own, one dump request each: all the rules of a
// table in one dump (google/nftables asks per chain), and a set's elements
// into one reused buffer without the peek before every read. It is what
// the read-back after every apply costs, so it is kept to the round trips
// the kernel needs. Not safe for concurrent use.
type dumper struct {
	fd  int
	seq uint32
	buf []byte
}

// dumpBufSize holds the largest skb a netfilter dump sends (the kernel
// fills up to 32 KiB, NLMSG_GOODSIZE being smaller) with room to spare.
const dumpBufSize = 64 << 10

// dumpTimeout bounds each read: the kernel answers a dump at once, so a
// read that waits this long has lost its answer.
const dumpTimeout = 5 * time.Second

// nfgenVersion is NFNETLINK_V0.
const nfgenVersion = 0

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (linux/netfilter/nf_tables.h;
// x/sys/unix lacks it): the end of a range element of a concatenated set.
const nftaSetElemKeyEnd = 10

// newDumper opens a NETLINK_NETFILTER socket in ns (nil: the caller's).
func newDumper(ns *netns.NsHandle) (*dumper, error) {
	var fd int
	err := inNS(ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netfilter socket: %w", err)
	}
	tv := unix.NsecToTimeval(dumpTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netfilter socket: receive timeout: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netfilter socket: bind: %w", err)
	}
	return &dumper{fd: fd, buf: make([]byte, dumpBufSize)}, nil
}

// Close closes the socket.
func (d *dumper) Close() error {
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// errDumpInterrupted is a dump the kernel flagged NLM_F_DUMP_INTR: the
// ruleset changed while it ran, so the reading is not one state.
var errDumpInterrupted = errors.New("netlink dump interrupted by a concurrent change")

// dump sends one dump request of msgType (an NFT_MSG_GET* of the nftables
// subsystem) for family with attrs and calls each with the payload (after
// the nfgenmsg header) of every reply of that request.
func (d *dumper) dump(msgType uint16, family nftables.TableFamily, attrs []netlink.Attribute, each func([]byte) error) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	d.seq++
	seq := d.seq
	hdrType := uint16(unix.NFNL_SUBSYS_NFTABLES)<<8 | msgType
	req := make([]byte, unix.NLMSG_HDRLEN+4+len(data))
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], hdrType)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:12], seq)
	req[unix.NLMSG_HDRLEN] = byte(family)
	req[unix.NLMSG_HDRLEN+1] = nfgenVersion
	copy(req[unix.NLMSG_HDRLEN+4:], data)
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send dump request: %w", err)
	}
	var interrupted, failed error
	for {
		n, _, err := unix.Recvfrom(d.fd, d.buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("read dump: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(d.buf[:n])
		if err != nil {
			return fmt.Errorf("parse dump: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // a late answer to an earlier request
			}
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = errDumpInterrupted
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return errors.Join(failed, interrupted)
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return errors.New("short netlink error message")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return fmt.Errorf("dump: %w", syscall.Errno(-code))
				}
				return errors.Join(failed, interrupted)
			case hdrType&0xff00 | unix.NFT_MSG_NEWRULE, hdrType&0xff00 | unix.NFT_MSG_NEWSETELEM:
				if len(m.Data) < 4 {
					return errors.New("short nftables message")
				}
				if err := each(m.Data[4:]); err != nil && failed == nil {
					failed = err
				}
			}
		}
	}
}

// tableRules are the rules of one table by chain, in the kernel's order,
// and the rules holding an expression the guard does not know (by rule,
// that expression's name): such a rule's Exprs lack it.
type tableRules struct {
	byChain map[string][]*nftables.Rule
	unknown map[*nftables.Rule]string
}

// rules reads every rule of table fam/table in one dump.
func (d *dumper) rules(fam nftables.TableFamily, table string) (tableRules, error) {
	out := tableRules{byChain: map[string][]*nftables.Rule{}, unknown: map[*nftables.Rule]string{}}
	err := d.dump(unix.NFT_MSG_GETRULE, fam, []netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")}}, func(b []byte) error {
		r, unknown, err := parseRule(fam, b)
		if err != nil {
			return err
		}
		if r.Table == nil || r.Table.Name != table {
			return nil
		}
		out.byChain[r.Chain.Name] = append(out.byChain[r.Chain.Name], r)
		if unknown != "" {
			out.unknown[r] = unknown
		}
		return nil
	})
	if err != nil {
		return tableRules{}, fmt.Errorf("list rules of table %s: %w", table, err)
	}
	return out, nil
}

// setElements reads the elements of set in table fam/table in one dump.
func (d *dumper) setElements(fam nftables.TableFamily, table, set string) ([]nftables.SetElement, error) {
	var out []nftables.SetElement
	err := d.dump(unix.NFT_MSG_GETSETELEM, fam, []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	}, func(b []byte) error {
		els, err := parseSetElements(b)
		out = append(out, els...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list elements of set %s: %w", set, err)
	}
	return out, nil
}

// newExpr is the expression type the kernel names name, for the
// expressions the guard's tables hold, and the ones a foreign edit is
// likely to add (so that it is shown, not just refused).
func newExpr(name string) expr.Any {
	switch name {
	case "bitwise":
		return &expr.Bitwise{}
	case "cmp":
		return &expr.Cmp{}
	case "connlimit":
		return &expr.Connlimit{}
	case "counter":
		return &expr.Counter{}
	case "ct":
		return &expr.Ct{}
	case "dynset":
		return &expr.Dynset{}
	case "fib":
		return &expr.Fib{}
	case "immediate":
		return &expr.Immediate{}
	case "lookup":
		return &expr.Lookup{}
	case "meta":
		return &expr.Meta{}
	case "payload":
		return &expr.Payload{}
	case "redir":
		return &expr.Redir{}
	case "range":
		return &expr.Range{}
	case "log":
		return &expr.Log{}
	case "limit":
		return &expr.Limit{}
	case "reject":
		return &expr.Reject{}
	case "nat":
		return &expr.NAT{}
	case "notrack":
		return &expr.Notrack{}
	case "masq":
		return &expr.Masq{}
	case "queue":
		return &expr.Queue{}
	case "quota":
		return &expr.Quota{}
	case "exthdr":
		return &expr.Exthdr{}
	case "objref":
		return &expr.Objref{}
	}
	return nil
}

// parseRule decodes a NEWRULE payload (the attributes after nfgenmsg).
// An expression it does not know is left out of Exprs and named in
// unknown (google/nftables skips it silently): the guard never writes one,
// so the rule is someone else's and must compare as different.
func parseRule(fam nftables.TableFamily, b []byte) (r *nftables.Rule, unknown string, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, "", err
	}
	ad.ByteOrder = binary.BigEndian
	r = &nftables.Rule{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			r.Table = &nftables.Table{Name: ad.String(), Family: fam}
		case unix.NFTA_RULE_CHAIN:
			r.Chain = &nftables.Chain{Name: ad.String()}
		case unix.NFTA_RULE_HANDLE:
			r.Handle = ad.Uint64()
		case unix.NFTA_RULE_POSITION:
			r.Position = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			r.UserData = ad.Bytes()
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				for nd.Next() {
					if nd.Type() != unix.NFTA_LIST_ELEM {
						return fmt.Errorf("rule expressions: attribute %d in the list", nd.Type())
					}
					nd.Nested(func(ed *netlink.AttributeDecoder) error {
						e, name, err := parseExpr(fam, ed)
						switch {
						case err != nil:
							return err
						case e == nil:
							if unknown == "" {
								unknown = name
							}
						default:
							r.Exprs = append(r.Exprs, e)
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return nil, "", fmt.Errorf("parse rule: %w", err)
	}
	if r.Chain == nil {
		return nil, "", errors.New("parse rule: no chain")
	}
	return r, unknown, nil
}

// parseExpr decodes one NFTA_LIST_ELEM of a rule's expressions: nil and
// the name for an expression newExpr does not know.
func parseExpr(fam nftables.TableFamily, ad *netlink.AttributeDecoder) (e expr.Any, name string, err error) {
	// google/nftables' decoders index into the data they are given (the
	// verdict's, for one): a malformed reply is an error here, not a
	// panic of the daemon.
	defer func() {
		if p := recover(); p != nil {
			e, err = nil, fmt.Errorf("rule expression %s: malformed: %v", name, p)
		}
	}()
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			name = ad.String()
		case unix.NFTA_EXPR_DATA:
			data = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return nil, "", err
	}
	if name == "" {
		return nil, "", errors.New("rule expression without a name")
	}
	e = newExpr(name)
	if e == nil {
		return nil, name, nil
	}
	if err := expr.Unmarshal(byte(fam), data, e); err != nil {
		return nil, "", fmt.Errorf("rule expression %s: %w", name, err)
	}
	// A verdict is an immediate into the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(byte(fam), data, v); err != nil {
			return nil, "", fmt.Errorf("rule expression verdict: %w", err)
		}
		e = v
	}
	return e, name, nil
}

// parseSetElements decodes a NEWSETELEM payload: each element's key, key
// end and interval-end flag (what the comparison looks at).
func parseSetElements(b []byte) ([]nftables.SetElement, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	var out []nftables.SetElement
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(ld *netlink.AttributeDecoder) error {
			for ld.Next() {
				if ld.Type() != unix.NFTA_LIST_ELEM {
					return fmt.Errorf("set elements: attribute %d in the list", ld.Type())
				}
				var el nftables.SetElement
				ld.Nested(func(ed *netlink.AttributeDecoder) error {
					for ed.Next() {
						switch ed.Type() {
						case unix.NFTA_SET_ELEM_KEY:
							ed.Nested(func(vd *netlink.AttributeDecoder) error { el.Key = dataValue(vd); return nil })
						case nftaSetElemKeyEnd:
							ed.Nested(func(vd *netlink.AttributeDecoder) error { el.KeyEnd = dataValue(vd); return nil })
						case unix.NFTA_SET_ELEM_FLAGS:
							el.IntervalEnd = ed.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
						}
					}
					return nil
				})
				out = append(out, el)
			}
			return nil
		})
	}
	if err := ad.Err(); err != nil {
		return nil, fmt.Errorf("parse set elements: %w", err)
	}
	return out, nil
}

// dataValue is the NFTA_DATA_VALUE of a nested nft_data.
func dataValue(ad *netlink.AttributeDecoder) []byte {
	var v []byte
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VALUE {
			v = ad.Bytes()
		}
	}
	return v
}
