package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		only    []string
		quick   bool
		wantErr bool
	}{
		{"all", nil, nil, false, false},
		{"two quick", []string{"-only", "lockdown, qga", "-quick"}, []string{"lockdown", "qga"}, true, false},
		{"unknown section", []string{"-only", "lockdwn"}, nil, false, true},
		{"stray argument", []string{"lockdown"}, nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseFlags(%q) = %v, want error %v; stderr:\n%s", tc.args, err, tc.wantErr, stderr.String())
			}
			if err == nil && (!slices.Equal(cfg.only, tc.only) || cfg.quick != tc.quick) {
				t.Errorf("parseFlags(%q) = %+v, want only %q quick %v", tc.args, cfg, tc.only, tc.quick)
			}
		})
	}
}

// TestUsageListsSections: -h names every registered section.
func TestUsageListsSections(t *testing.T) {
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, s := range sections {
		if !strings.Contains(stderr.String(), "  "+s.name+" ") {
			t.Errorf("usage does not list section %q:\n%s", s.name, stderr.String())
		}
	}
	if len(sections) < 6 {
		t.Errorf("%d sections, want at least guard, layer2, lockdown, qga, api and egress", len(sections))
	}
}
