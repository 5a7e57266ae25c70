package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/pve-inspect/pve-inspect/hardening"
)

// exitNotFound is a shell's exit status for a missing command.
const exitNotFound = 127

// boot starts the build VM and waits for cloud-init's first boot and the
// recipe's checks.
func (b *Builder) boot(ctx context.Context, vmid int) error {
	b.say("boot", "starting VM %d", vmid)
	if err := b.px.StartVM(ctx, vmid); err != nil {
		return err
	}
	if err := b.waitAgent(ctx, vmid); err != nil {
		return err
	}
	if err := b.waitCloudInit(ctx, vmid); err != nil {
		return err
	}
	if err := b.runAll(ctx, vmid, "check", b.o.Recipe.Checks); err != nil {
		return err
	}
	return b.runAll(ctx, vmid, "prepare", b.o.Recipe.Seal)
}

// runAll runs each command through the agent; each must exit 0.
func (b *Builder) runAll(ctx context.Context, vmid int, step string, cmds [][]string) error {
	for _, argv := range cmds {
		res, err := b.agent.Exec(ctx, vmid, argv, 2*time.Minute)
		if err != nil {
			return fmt.Errorf("%s %q: %w", step, strings.Join(argv, " "), err)
		}
		if res.Exit != 0 || res.TimedOut {
			return fmt.Errorf("%s %q failed (exit %d): %s", step, strings.Join(argv, " "), res.Exit, tail(res.Output))
		}
		b.say(step, "%s: ok", strings.Join(argv, " "))
	}
	return nil
}

// waitAgent probes the guest agent (a `true` through it) until it
// answers or AgentWait passes.
func (b *Builder) waitAgent(ctx context.Context, vmid int) error {
	b.say("agent", "waiting up to %s for the guest agent (cloud-init installs it)", b.o.AgentWait)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, b.o.AgentWait)
	defer cancel()
	var last error
	for {
		res, err := b.agent.Exec(ctx, vmid, []string{"true"}, 10*time.Second)
		if err == nil && res.Exit == 0 {
			b.say("agent", "the guest agent answers")
			return nil
		}
		if err == nil {
			err = fmt.Errorf("`true` exited %d", res.Exit)
		}
		last = errors.New(printable(err.Error()))
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				// the build's own end (cancelled, or its timeout, which Run
				// says), not AgentWait
				return fmt.Errorf("waiting for the guest agent of VM %d (last: %v): %w", vmid, last, parent.Err())
			}
			return fmt.Errorf("the guest agent of VM %d did not answer within %s (last: %v): is cloud-init able to install qemu-guest-agent (the bridge's way to the package mirrors)?", vmid, b.o.AgentWait, last)
		case <-time.After(b.o.AgentPoll):
		}
	}
}

// waitCloudInit runs `cloud-init status --wait` (bounded by
// CloudInitWait): done passes, degraded (exit 2) passes with a warning,
// error fails with its output, and a guest without cloud-init leaves the
// verdict to the checks.
func (b *Builder) waitCloudInit(ctx context.Context, vmid int) error {
	b.say("cloud-init", "waiting up to %s for cloud-init to finish", b.o.CloudInitWait)
	res, err := b.agent.Exec(ctx, vmid, []string{"cloud-init", "status", "--wait"}, b.o.CloudInitWait)
	if err != nil {
		return fmt.Errorf("cloud-init status --wait: %w", err)
	}
	if res.TimedOut {
		return fmt.Errorf("cloud-init did not finish within %s (--cloud-init-wait): %s", b.o.CloudInitWait, tail(strings.TrimLeft(res.Output, ".")))
	}
	switch res.Exit {
	case 0:
		b.say("cloud-init", "done")
	case 2:
		b.say("cloud-init", "done with recoverable errors (degraded); the checks decide: %s", tail(res.Output))
	case exitNotFound:
		b.say("cloud-init", "the image has no cloud-init; the checks decide")
	default:
		return fmt.Errorf("cloud-init failed (exit %d): %s", res.Exit, tail(res.Output))
	}
	return nil
}

// tail is the end of a command's output, for an error, with no control
// character of the guest's (printable).
func tail(s string) string {
	s = strings.TrimSpace(printable(s))
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	return s
}

// sealDelete are the keys deleted before the conversion: the cloud-init
// drive (which frees its volume), its settings, and the build's NIC.
var sealDelete = []string{"ide2", "cicustom", "net0"}

// seal shuts the VM down, strips what only the build needed, checks the
// hardened profile, converts it to a template, records it with the
// digest of its image and tags it (toTemplate).
func (b *Builder) seal(ctx context.Context, vmid int, image string) (hardening.Report, error) {
	if err := b.stillOurs(ctx, vmid, "seal"); err != nil {
		return hardening.Report{}, err
	}
	b.say("seal", "shutting VM %d down", vmid)
	if err := b.px.ShutdownVM(ctx, vmid, b.o.ShutdownWait, true); err != nil {
		return hardening.Report{}, err
	}
	if err := b.px.UpdateVMConfig(ctx, vmid, nil, sealDelete); err != nil {
		return hardening.Report{}, fmt.Errorf("remove the cloud-init drive and the build's NIC: %w", err)
	}
	return b.toTemplate(ctx, vmid, image)
}

// toTemplate checks the hardened profile of the stopped build VM vmid,
// converts it to a template, records it with the digest of its image and
// the build's mode, and tags it.
func (b *Builder) toTemplate(ctx context.Context, vmid int, image string) (hardening.Report, error) {
	conf, err := b.px.VMConfig(ctx, vmid)
	if err != nil {
		return hardening.Report{}, err
	}
	if f := hardening.CheckTemplate(conf).TemplateFailures(); len(f) > 0 {
		return hardening.Report{}, fmt.Errorf("VM %d is not in the hardened profile: %v", vmid, f)
	}
	if err := b.stillOurs(ctx, vmid, "convert"); err != nil {
		return hardening.Report{}, err
	}
	b.say("seal", "converting VM %d to a template", vmid)
	if err := b.px.ConvertToTemplate(ctx, vmid); err != nil {
		return hardening.Report{}, err
	}
	if conf, err = b.px.VMConfig(ctx, vmid); err != nil {
		return hardening.Report{}, err
	}
	if conf["template"] != "1" {
		return hardening.Report{}, fmt.Errorf("VM %d is not a template after its conversion", vmid)
	}
	rep := hardening.CheckTemplate(conf)
	if f := rep.TemplateFailures(); len(f) > 0 {
		return rep, fmt.Errorf("template %d is not in the hardened profile: %v", vmid, f)
	}
	// Recorded as a template before it is tagged as one: a build killed
	// in between leaves a VM tagged building, which the next destroys.
	if err := b.host.Record(vmid, Record{Name: b.o.Name, State: StateTemplate, Image: image, Mode: b.o.Mode}); err != nil {
		return rep, fmt.Errorf("record template %d in the build ledger: %w", vmid, err)
	}
	tags := strings.Join(b.wantTags(), ";")
	if err := b.px.UpdateVMConfig(ctx, vmid, map[string]string{"tags": tags}, nil); err != nil {
		return rep, fmt.Errorf("tag template %d: %w", vmid, err)
	}
	b.say("seal", "tagged %s", tags)
	return rep, nil
}

// printable drops every control character (C0, DEL and C1, so escape and
// OSC sequences lose their introducers) but newline and tab, and makes
// invalid UTF-8 a replacement character: the hostile guest's output goes
// to the operator's terminal.
func printable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Map(func(r rune) rune {
		if r != '\n' && r != '\t' && unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}
