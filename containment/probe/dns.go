package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dns sends one recursive query over UDP and reports the reply's rcode and
// answer count. It resends once halfway through the timeout and ignores
// datagrams that are not the reply to its query.
func (p *Prober) dns(ctx context.Context, t Target, addr string) Result {
	qtype := dnsmessage.TypeA
	if strings.EqualFold(t.QType, "AAAA") {
		qtype = dnsmessage.TypeAAAA
	}
	name := t.Name
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	qname, err := dnsmessage.NewName(name)
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "query name: " + err.Error()}
	}
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return Result{Outcome: OutcomeError, Detail: "query id: " + err.Error()}
	}
	id := binary.BigEndian.Uint16(idb[:])
	q := dnsmessage.Question{Name: qname, Type: qtype, Class: dnsmessage.ClassINET}
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{q},
	}
	wire, err := msg.Pack()
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "pack query: " + err.Error()}
	}

	c, err := p.dialer().DialContext(ctx, "udp", addr)
	if err != nil {
		return Result{Outcome: classify(ctx, err), Detail: err.Error()}
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	resend := time.Now().Add(time.Until(deadline) / 2)
	if _, err := c.Write(wire); err != nil {
		return Result{Outcome: classify(ctx, err), Detail: "send: " + err.Error()}
	}
	sentTwice := false
	buf := make([]byte, 65535)
	for {
		rd := deadline
		if !sentTwice {
			rd = resend
		}
		_ = c.SetReadDeadline(rd)
		n, err := c.Read(buf)
		if err != nil {
			if isTimeout(err) && !sentTwice && time.Now().Before(deadline) {
				sentTwice = true
				if _, err := c.Write(wire); err != nil {
					return Result{Outcome: classify(ctx, err), Detail: "resend: " + err.Error()}
				}
				continue
			}
			if isTimeout(err) || ctx.Err() != nil {
				return Result{Outcome: OutcomeNoReply, Detail: "no reply"}
			}
			return Result{Outcome: classify(ctx, err), Detail: err.Error()}
		}
		var pr dnsmessage.Parser
		h, err := pr.Start(buf[:n])
		if err != nil || h.ID != id || !h.Response {
			continue // not ours
		}
		qs, err := pr.AllQuestions()
		if err != nil || len(qs) != 1 || !strings.EqualFold(qs[0].Name.String(), qname.String()) || qs[0].Type != qtype {
			if h.RCode == dnsmessage.RCodeSuccess || len(qs) != 0 {
				continue // a reply to something else
			}
			// Some servers omit the question in error replies (e.g. REFUSED).
		}
		answers := 0
		for {
			ah, err := pr.AnswerHeader()
			if err != nil {
				break
			}
			if ah.Type == qtype {
				answers++
			}
			if err := pr.SkipAnswer(); err != nil {
				break
			}
		}
		return Result{Outcome: OutcomeResponse, RCode: rcodeName(h.RCode), Answers: answers}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// rcodeNames are the rcodes the probe names; others read as RCODE<n>.
var rcodeNames = map[dnsmessage.RCode]string{
	dnsmessage.RCodeSuccess:        "NOERROR",
	dnsmessage.RCodeFormatError:    "FORMERR",
	dnsmessage.RCodeServerFailure:  "SERVFAIL",
	dnsmessage.RCodeNameError:      "NXDOMAIN",
	dnsmessage.RCodeNotImplemented: "NOTIMP",
	dnsmessage.RCodeRefused:        "REFUSED",
}

func rcodeName(r dnsmessage.RCode) string {
	if s, ok := rcodeNames[r]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(int(r))
}

// resolveA asks server for name's A records and returns the first.
func (p *Prober) resolveA(ctx context.Context, server, name string) (netip.Addr, error) {
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	qname, err := dnsmessage.NewName(name)
	if err != nil {
		return netip.Addr{}, err
	}
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return netip.Addr{}, err
	}
	id := binary.BigEndian.Uint16(idb[:])
	msg := dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	wire, err := msg.Pack()
	if err != nil {
		return netip.Addr{}, err
	}
	c, err := p.dialer().DialContext(ctx, "udp", server)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	if _, err := c.Write(wire); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return netip.Addr{}, err
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil || m.ID != id || !m.Response {
			continue
		}
		if m.RCode != dnsmessage.RCodeSuccess {
			return netip.Addr{}, fmt.Errorf("rcode %s", m.RCode)
		}
		for _, a := range m.Answers {
			if r, ok := a.Body.(*dnsmessage.AResource); ok {
				return netip.AddrFrom4(r.A), nil
			}
		}
		return netip.Addr{}, errors.New("no A record")
	}
}
