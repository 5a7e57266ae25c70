package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/lockdown/halt"
)

func TestCheckReason(t *testing.T) {
	tests := []struct {
		reason string
		ok     bool
	}{
		{"no default route", true},
		{"", false},
		{"   ", false},
		{"line\nbreak", false},
		{"tab\there", false},
		{strings.Repeat("x", 200), true},
		{strings.Repeat("x", 201), false},
	}
	for _, tt := range tests {
		if err := checkReason(tt.reason); (err == nil) != tt.ok {
			t.Errorf("checkReason(%q) = %v, want ok=%v", tt.reason, err, tt.ok)
		}
	}
}

func TestHaltCmdRejectsBadReason(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "halted")
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("[halt]\nstate_file = \""+state+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-c", cfg, "halt"},
		{"-c", cfg, "halt", "--reason", ""},
		{"-c", cfg, "halt", "--reason", "a\nb"},
	} {
		root := newRootCmd()
		root.SetArgs(args)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		if err := root.ExecuteContext(context.Background()); err == nil {
			t.Errorf("%q accepted", args)
		}
		if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%q wrote the state file", args)
		}
	}
}

// TestRouteCause: with the marker present the cause persists while the
// guard's classification finds no management interface.
func TestRouteCause(t *testing.T) {
	tests := []struct {
		name    string
		marker  bool
		mgmt    []string
		err     error
		persist bool
	}{
		{"no marker, no route", false, nil, nil, false},
		{"marker, default route", true, []string{"vmbr0"}, nil, false},
		{"marker, no default route", true, nil, nil, true},
		{"marker, classification fails", true, nil, errors.New("netlink: boom"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			rc := routeCause{marker: filepath.Join(dir, "marker"), management: func(context.Context) ([]string, error) { return tt.mgmt, tt.err }}
			if tt.marker {
				if err := os.WriteFile(rc.marker, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := rc.check(context.Background(), halt.State{Reason: "x"})
			if (err != nil) != tt.persist {
				t.Errorf("check = %v, want cause persisting=%v", err, tt.persist)
			}
		})
	}
}
