package config

import (
	"errors"
	"slices"
	"testing"
)

func TestHaltSection(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantKey string
	}{
		{"defaults", "", ""},
		{"all keys", "[halt]\nunits = [\"pveproxy.service\", \"spiceproxy.service\"]\nstate_file = \"/run/x/halted\"\ntransport = \"private\"\n", ""},
		{"empty units", "[halt]\nunits = []\n", "halt.units"},
		{"bad unit", "[halt]\nunits = [\"pveproxy\"]\n", "halt.units"},
		{"relative state file", "[halt]\nstate_file = \"run/halted\"\n", "halt.state_file"},
		{"bad transport", "[halt]\ntransport = \"tcp\"\n", "halt.transport"},
		{"unknown key", "[halt]\nunit = [\"a.service\"]\n", "halt.unit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(tt.doc)
			if tt.wantKey == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tt.wantKey {
				t.Fatalf("Parse = %v, want a KeyError for %s", err, tt.wantKey)
			}
			_ = c
		})
	}
	c, err := Parse("[halt]\nunits = [\"a.service\"]\n")
	if err != nil || !slices.Equal(c.Halt.Units, []string{"a.service"}) {
		t.Errorf("units = %v, %v", c.Halt.Units, err)
	}
}
