package testvm

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// dialFrom opens a TCP connection from inside netns ns.
func dialFrom(b *Bed, ns, addr string) error {
	return b.Do(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func httpFrom(b *Bed, ns, method, url string, hdr map[string]string) (int, string, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// net/http dials on goroutines of its own, which are not in ns: dial
	// here, on the thread inside ns, and hand the transport that one conn.
	var conn net.Conn
	if err := b.Do(ns, func() error {
		host := req.URL.Host
		if req.URL.Port() == "" {
			host = net.JoinHostPort(req.URL.Hostname(), "80")
		}
		conn, err = net.DialTimeout("tcp", host, 2*time.Second)
		return err
	}); err != nil {
		return 0, "", err
	}
	used := false
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, fmt.Errorf("second dial refused: only the conn made in %s may be used", ns)
			}
			used = true
			return conn, nil
		}}
	cl := &http.Client{Transport: tr, Timeout: time.Minute}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	buf := make([]byte, 256)
	n, _ := resp.Body.Read(buf)
	return resp.StatusCode, string(buf[:n]), nil
}

// TestBedReachability checks from guest A's namespace that, with no guard,
// everything the guard will later block is reachable: the bed can see a
// leak. (The same through the probe and the real agent lives with the
// containment runner.)
func TestBedReachability(t *testing.T) {
	testkit.RequireRoot(t)
	b, ga, gb := upTwoZones(t)
	for _, tc := range []struct {
		name, addr string
	}{
		{"internet 80", InternetAddr + ":80"},
		{"internet 443", InternetAddr + ":443"},
		{"lan", LANAddr + ":80"},
		{"node 8006 via gateway", "10.10.1.1:8006"},
		{"node 22 via mgmt addr", NodeMgmtAddr + ":22"},
		{"node 3128 via other zone gw", "10.10.2.1:3128"},
		{"azure", AzureWireAddr + ":80"},
		{"alibaba", AlibabaMDAddr + ":80"},
		{"internet v6", "[" + InternetAddr6 + "]:80"},
		{"metadata v6", "[" + MetadataAddr6 + "]:80"},
	} {
		if err := dialFrom(b, ga.NS, tc.addr); err != nil {
			t.Errorf("%s (%s): %v", tc.name, tc.addr, err)
		}
	}
	// Guest B has no listener: a refusal proves the route.
	err := dialFrom(b, ga.NS, gb.IPv4().String()+":80")
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("guest B: want connection refused (route exists), got %v", err)
	}
	code, body, err := httpFrom(b, ga.NS, "GET", "http://"+MetadataAddr+"/latest/meta-data/instance-id", nil)
	if err != nil || code != 200 || body != InstanceID {
		t.Errorf("metadata GET: %d %q %v", code, body, err)
	}
	code, _, err = httpFrom(b, ga.NS, "PUT", "http://"+MetadataAddr+"/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
	if err != nil || code != 200 {
		t.Errorf("metadata token PUT: %d %v", code, err)
	}
	// The zone resolver answers its local name and recurses for example.test.
	for _, q := range []struct {
		name string
		want string
	}{{LocalName("zonea"), "10.10.1.1"}, {InternetName, InternetAddr}} {
		err := b.Do(ga.NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(q.name), dns.TypeA)
			r, _, err := (&dns.Client{Timeout: time.Minute}).Exchange(m, "10.10.1.1:53")
			if err != nil {
				return err
			}
			if len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), q.want) {
				return fmt.Errorf("answer %v", r.Answer)
			}
			return nil
		})
		if err != nil {
			t.Errorf("dns %s: %v", q.name, err)
		}
	}
	// The guest's resolv.conf came from DHCP, inside its own root.
	out := rawExec(t, ga.Socket, "/bin/cat", "/etc/resolv.conf")
	if !strings.Contains(out, "10.10.1.1") {
		t.Errorf("guest resolv.conf: %q", out)
	}
	// Isolation: a file the guest writes stays on its disk; it sees only its
	// own processes.
	marker := "/root/pve-inspect-bed-" + b.Name()
	rawExec(t, ga.Socket, "/bin/sh", "-c", "echo hi > "+marker)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("guest write reached the host: %s", marker)
	}
	if _, err := os.Stat(filepath.Join(ga.Disk, "upper", marker)); err != nil {
		t.Errorf("guest write not on its disk: %v", err)
	}
	ps := rawExec(t, ga.Socket, "/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'")
	if n := strings.TrimSpace(ps); n == "" || len(n) > 2 {
		t.Errorf("guest sees %q processes; want a handful", n)
	}
	if out := rawExec(t, ga.Socket, "/bin/sh", "-c", "mount -t tmpfs x /mnt 2>&1; echo rc=$?"); !strings.Contains(out, "rc=") || strings.Contains(out, "rc=0") {
		t.Errorf("guest could mount: %q", out)
	}
}

// rawExec runs argv in a guest through a minimal hand-written guest-exec
// exchange (the bed must not depend on the client it helps to test).
func rawExec(t *testing.T, sock string, argv ...string) string {
	t.Helper()
	call := func(cmd any) json.RawMessage {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		if err := json.NewEncoder(c).Encode(cmd); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Return json.RawMessage `json:"return"`
			Error  any             `json:"error"`
		}
		if err := json.Unmarshal(line, &r); err != nil || r.Error != nil {
			t.Fatalf("agent reply %s: %v", line, err)
		}
		return r.Return
	}
	var pid struct{ Pid int }
	_ = json.Unmarshal(call(map[string]any{"execute": "guest-exec", "arguments": map[string]any{"path": argv[0], "arg": argv[1:], "capture-output": true}}), &pid)
	for i := 0; i < 3000; i++ { // a minute
		var st struct {
			Exited bool   `json:"exited"`
			Out    string `json:"out-data"`
		}
		_ = json.Unmarshal(call(map[string]any{"execute": "guest-exec-status", "arguments": map[string]any{"pid": pid.Pid}}), &st)
		if st.Exited {
			b, _ := base64.StdEncoding.DecodeString(st.Out)
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("exec %v did not finish", argv)
	return ""
}
