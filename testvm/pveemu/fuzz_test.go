package pveemu

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzParams feeds arbitrary bodies and query strings through the request
// decoding, legacy normalisation and schema validation of a few endpoints.
// It must never panic, and whatever the validator accepts must consist of
// known parameters only, with required ones present.
func FuzzParams(f *testing.F) {
	f.Add("application/json", `{"newid":101,"full":true,"name":"a"}`, "")
	f.Add("application/x-www-form-urlencoded", "newid=101&full=1&pool=sbx", "")
	f.Add("application/x-www-form-urlencoded", "net0=virtio%3DBC:24:11:00:00:01,bridge%3Dvnet1&memory=512", "delete=agent")
	f.Add("application/json", `{"command":["echo","x"],"input-data":""}`, "")
	f.Add("application/x-www-form-urlencoded", "subnet=10.0.0.0/24&type=subnet&dhcp-range=start-address=10.0.0.2,end-address=10.0.0.9", "")
	f.Add("application/json", `{"zone":"bad_zone","type":"simple"}`, "zone=a")
	f.Add("", "a=%zz&b&=&;;", "x=%ff%00")
	s, err := LoadSchema()
	if err != nil {
		f.Fatal(err)
	}
	var eps []*Endpoint
	for _, k := range []string{"POST /nodes/{node}/qemu/{vmid}/clone", "PUT /nodes/{node}/qemu/{vmid}/config", "POST /nodes/{node}/qemu/{vmid}/agent/exec",
		"POST /cluster/sdn/vnets/{vnet}/subnets", "POST /cluster/sdn/zones", "POST /nodes/{node}/firewall/rules", "PUT /access/acl"} {
		m, p, _ := strings.Cut(k, " ")
		ep, ok := s.Endpoint(m, p)
		if !ok {
			f.Fatalf("no %s", k)
		}
		eps = append(eps, ep)
	}
	f.Fuzz(func(t *testing.T, ct, body, query string) {
		r, err := http.NewRequest("POST", "https://x/api2/json/y?"+query, nil)
		if err != nil {
			return
		}
		r.URL.RawQuery = query
		r.Header.Set("Content-Type", ct)
		params, err := decodeParams(r, []byte(body))
		if err != nil {
			if _, ok := err.(*apiError); !ok {
				t.Fatalf("decode error of type %T", err)
			}
			return
		}
		for _, ep := range eps {
			p := map[string]any{}
			for k, v := range params {
				p[k] = v
			}
			for _, pathParam := range []string{"node", "vmid", "vnet"} {
				if _, ok := ep.Params.Properties[pathParam]; ok {
					p[pathParam] = map[string]string{"node": "pve", "vmid": "100", "vnet": "vnet1"}[pathParam]
				}
			}
			normalizeLegacyParams(ep.Params, p)
			if errs := ep.Validate(p); errs == nil {
				for k, v := range p {
					if _, ok := ep.Params.lookup(k); !ok {
						t.Fatalf("%s %s: accepted unknown parameter %q", ep.Method, ep.Path, k)
					}
					_ = v
				}
				for name, sub := range ep.Params.Properties {
					if !bool(sub.Optional) && sub.Alias == "" && !strings.HasSuffix(name, "[n]") && p[name] == nil {
						t.Fatalf("%s %s: accepted without required %q", ep.Method, ep.Path, name)
					}
				}
			}
		}
	})
}

// FuzzURLEncoded checks the urlencoded decoder against the properties a
// caller relies on: no panic, valid UTF-8 keys and values.
func FuzzURLEncoded(f *testing.F) {
	f.Add("a=1&b=2;c=%41&a=3")
	f.Add("k=v=w&x")
	f.Add("%e2%82")
	f.Fuzz(func(t *testing.T, data string) {
		for k, v := range decodeURLEncoded(data) {
			if !isValidUTF8(k) {
				t.Fatalf("key %q not UTF-8", k)
			}
			switch tv := v.(type) {
			case string:
				if !isValidUTF8(tv) {
					t.Fatalf("value %q not UTF-8", tv)
				}
			case []string:
				if len(tv) < 2 {
					t.Fatalf("list of %d for %q", len(tv), k)
				}
			case nil:
			default:
				t.Fatalf("unexpected %T", v)
			}
		}
		_ = url.Values{}
	})
}

// FuzzPropertyString: the property-string parser never panics and never
// accepts a key its format does not define.
func FuzzPropertyString(f *testing.F) {
	f.Add("virtio=BC:24:11:00:00:01,bridge=vnet1,firewall=1")
	f.Add("virtio,bridge=vnet1,bogus=1")
	f.Add("e1000=,,=,")
	s, err := LoadSchema()
	if err != nil {
		f.Fatal(err)
	}
	ep, _ := s.Endpoint("PUT", "/nodes/{node}/qemu/{vmid}/config")
	net, ok := ep.Params.lookup("net0")
	if !ok || net.formatMap == nil {
		f.Fatal("net[n] format missing")
	}
	f.Fuzz(func(t *testing.T, v string) {
		if err := parsePropertyString(net.formatMap, v, "net0"); err != nil {
			return
		}
		for _, part := range strings.Split(v, ",") {
			k, _, hasEq := strings.Cut(part, "=")
			if hasEq && net.formatMap[k] == nil {
				t.Fatalf("accepted unknown key %q in %q", k, v)
			}
		}
	})
}

func isValidUTF8(s string) bool { return strings.ToValidUTF8(s, "") == s }
