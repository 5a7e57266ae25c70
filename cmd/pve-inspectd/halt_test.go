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

const route4Header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

func TestDefaultRoute4(t *testing.T) {
	tests := []struct {
		name, table string
		want        bool
	}{
		{"default via eth0", "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", true},
		{"only a subnet", "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", false},
		{"default on lo", "lo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n", false},
		{"default route down", "eth0\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n", false},
		{"reject route", "eth0\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := defaultRoute4(strings.NewReader(route4Header + tt.table))
			if err != nil || got != tt.want {
				t.Errorf("defaultRoute4 = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := defaultRoute4(strings.NewReader(route4Header + "eth0\t00000000\t0\tzz\t0\t0\t0\t00000000\n")); err == nil {
		t.Error("bad flags accepted")
	}
}

func TestDefaultRoute6(t *testing.T) {
	zero := strings.Repeat("0", 32)
	tests := []struct {
		name, table string
		want        bool
	}{
		{"default via eth0", zero + " 00 " + zero + " 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n", true},
		{"unreachable default on lo", zero + " 00 " + zero + " 00 " + zero + " ffffffff 00000001 00000000 00200200       lo\n", false},
		{"prefix route", "fd000000000000000000000000000000 40 " + zero + " 00 " + zero + " 00000100 00000001 00000000 00000001     eth0\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := defaultRoute6(strings.NewReader(tt.table))
			if err != nil || got != tt.want {
				t.Errorf("defaultRoute6 = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestRouteCause(t *testing.T) {
	withRoute := route4Header + "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
	tests := []struct {
		name    string
		marker  bool
		route4  string
		persist bool
	}{
		{"no marker, no route", false, route4Header, false},
		{"marker, default route", true, withRoute, false},
		{"marker, no default route", true, route4Header, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			rc := routeCause{marker: filepath.Join(dir, "marker"), procNet: dir}
			if tt.marker {
				if err := os.WriteFile(rc.marker, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "route"), []byte(tt.route4), 0o644); err != nil {
				t.Fatal(err)
			}
			err := rc.check(context.Background(), halt.State{Reason: "x"})
			if (err != nil) != tt.persist {
				t.Errorf("check = %v, want cause persisting=%v", err, tt.persist)
			}
		})
	}
}
