package config

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestCheckSection(t *testing.T) {
	c, err := Parse("[node]\nid = \"n1\"\n[check]\nprobe_path = \"/opt/probe\"\ntimeout = \"1500ms\"\nconcurrency = 4\nbudget = 300\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Check.ProbePath != "/opt/probe" || c.Check.Timeout != 1500*time.Millisecond || c.Check.Concurrency != 4 || c.Check.Budget != 300 || c.Check.GuestDir != "/tmp" {
		t.Errorf("check = %+v", c.Check)
	}
	d, err := Parse("[node]\nid = \"n1\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Check, defaultCheck()) {
		t.Errorf("defaults = %+v", d.Check)
	}
	for _, c := range []struct{ doc, key string }{
		{"[check]\nprobe_path = \"probe\"\n", "check.probe_path"},
		{"[check]\nlan = [\"192.168.1.1\"]\n", "check.lan"},
		{"[check]\npublic = [\"2001:db8::1\"]\n", "check.public"},
		{"[check]\npublic6 = [\"203.0.113.1\"]\n", "check.public6"},
		{"[check]\nexternal_name = \"a b\"\n", "check.external_name"},
		{"[check]\nlocal_name = \"x/y\"\n", "check.local_name"},
		{"[check]\nguest_dir = \"tmp\"\n", "check.guest_dir"},
		{"[check]\ntimeout = \"0s\"\n", "check.timeout"},
		{"[check]\ntimeout = \"2m\"\n", "check.timeout"},
		{"[check]\nconcurrency = 0\n", "check.concurrency"},
		{"[check]\nconcurrency = 65\n", "check.concurrency"},
		{"[check]\nbudget = 63\n", "check.budget"},
		{"[check]\nbudget = 2049\n", "check.budget"},
		{"[check]\nprobe = \"/x\"\n", "check.probe"},
	} {
		_, err := Parse("[node]\nid = \"n1\"\n" + c.doc)
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != c.key {
			t.Errorf("%q: error %v, want one naming %s", c.doc, err, c.key)
		}
	}
}
