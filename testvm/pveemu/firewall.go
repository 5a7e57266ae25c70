package pveemu

import (
	"context"
	"fmt"
	"strconv"
)

type firewall struct {
	rules   []map[string]string
	options map[string]string
}

func newFirewall() *firewall { return &firewall{options: map[string]string{}} }

func (s *Server) fwScope(rq *request) (*firewall, error) {
	if rq.has("node") {
		if err := s.checkNode(rq); err != nil {
			return nil, err
		}
		return s.fw["node"], nil
	}
	return s.fw["cluster"], nil
}

func rulesDigest(fw *firewall) string {
	m := map[string]string{}
	for i, r := range fw.rules {
		m[strconv.Itoa(i)] = fmt.Sprint(r)
	}
	return confDigest(m)
}

func ruleValue(k, v string) any {
	switch k {
	case "enable", "log-level-in", "ipversion":
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return v
}

func (s *Server) listRules(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for i, r := range fw.rules {
		e := map[string]any{"pos": i, "digest": rulesDigest(fw)}
		for k, v := range r {
			e[k] = ruleValue(k, v)
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Server) getRule(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	pos := rq.int("pos", -1)
	if pos < 0 || pos >= len(fw.rules) {
		return nil, fail("no rule at position %d", pos)
	}
	e := map[string]any{"pos": pos}
	for k, v := range fw.rules[pos] {
		e[k] = ruleValue(k, v)
	}
	return e, nil
}

var ruleKeys = []string{"type", "action", "enable", "source", "dest", "proto", "dport", "sport", "comment", "iface", "log", "macro", "icmp-type"}

func (s *Server) createRule(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	if d := rq.str("digest"); d != "" && d != rulesDigest(fw) {
		return nil, fail("detected modified configuration - file changed by other user? Try again.")
	}
	r := map[string]string{}
	for _, k := range ruleKeys {
		if rq.has(k) {
			r[k] = rq.str(k)
		}
	}
	// pve-firewall API2/Firewall/Rules.pm create_rule: enable defaults to
	// 0 and the rule goes to the top, whatever "pos" says.
	if _, ok := r["enable"]; !ok {
		r["enable"] = "0"
	}
	fw.rules = append([]map[string]string{r}, fw.rules...)
	return nil, nil
}

func (s *Server) deleteRule(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	if d := rq.str("digest"); d != "" && d != rulesDigest(fw) {
		return nil, fail("detected modified configuration - file changed by other user? Try again.")
	}
	pos := rq.int("pos", -1)
	if pos < 0 || pos >= len(fw.rules) {
		return nil, fail("no rule at position %d", pos)
	}
	fw.rules = append(fw.rules[:pos], fw.rules[pos+1:]...)
	return nil, nil
}

func (s *Server) getFWOptions(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"digest": confDigest(fw.options)}
	for k, v := range fw.options {
		out[k] = ruleValue(k, v)
		if n, err := strconv.Atoi(v); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

func (s *Server) putFWOptions(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, err := s.fwScope(rq)
	if err != nil {
		return nil, err
	}
	if d := rq.str("digest"); d != "" && d != confDigest(fw.options) {
		return nil, fail("detected modified configuration - file changed by other user? Try again.")
	}
	for _, k := range splitList(rq.str("delete")) {
		delete(fw.options, k)
	}
	for k := range rq.params {
		if k == "node" || k == "delete" || k == "digest" {
			continue
		}
		fw.options[k] = rq.str(k)
	}
	return nil, nil
}
