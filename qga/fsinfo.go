package qga

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// maxFilesystems bounds the filesystems kept of one guest-get-fsinfo
// answer, maxFSString each name; the answer is the guest's word and sized
// by it.
const (
	maxFilesystems = 64
	maxFSString    = 256
)

// maxFSInfoReply bounds a guest-get-fsinfo reply line: far below
// MaxReplyBytes (sized for file reads), and far above what a guest with a
// few hundred mounts answers (a few hundred bytes each). The health
// monitor asks every VM for it every round, so what a hostile guest can
// pin with it is this, not a file read's reply.
const maxFSInfoReply = 1 << 20

// Filesystem is one mounted filesystem as the agent reports it
// (guest-get-fsinfo; used-bytes and total-bytes since QEMU 3.0). The
// guest controls every field.
type Filesystem struct {
	Name       string `json:"name"`
	Mountpoint string `json:"mountpoint"`
	Type       string `json:"type"`
	UsedBytes  *int64 `json:"used-bytes"`
	TotalBytes *int64 `json:"total-bytes"`
}

// Filesystems asks the agent for the guest's mounted filesystems
// (guest-get-fsinfo). The reply line is bounded by maxFSInfoReply; at
// most maxFilesystems are returned, with their strings clipped and sizes
// that are absent or negative read as 0.
func (a *Agent) Filesystems(ctx context.Context) ([]Filesystem, error) {
	var fs []Filesystem
	err := a.session(ctx, func(cn *conn) error {
		cn.limit = maxFSInfoReply
		var raw json.RawMessage
		if err := cn.call("guest-get-fsinfo", nil, &raw); err != nil {
			return err
		}
		// the copy of the return value and what is decoded of it live
		// while the reply buffer does: the budget holds them too
		n := 2 * int64(len(raw))
		if err := cn.grow(n); err != nil {
			return cn.failBudget("guest-get-fsinfo", err)
		}
		defer cn.shrink(n)
		var err error
		fs, err = parseFSInfo(raw)
		return err
	})
	if err != nil {
		return nil, err
	}
	return fs, nil
}

// parseFSInfo decodes and bounds a guest-get-fsinfo return value.
func parseFSInfo(raw []byte) ([]Filesystem, error) {
	var all []Filesystem
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, &ProtocolError{Kind: KindMalformed, Command: "guest-get-fsinfo", Err: fmt.Errorf("return value: %w", err)}
	}
	if len(all) > maxFilesystems {
		all = all[:maxFilesystems]
	}
	for i := range all {
		f := &all[i]
		f.Name, f.Mountpoint, f.Type = clipFS(f.Name), clipFS(f.Mountpoint), clipFS(f.Type)
	}
	return all, nil
}

// clipFS clips s to maxFSString bytes of valid UTF-8.
func clipFS(s string) string {
	if len(s) > maxFSString {
		s = s[:maxFSString]
	}
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // replaces invalid bytes with U+FFFD
	}
	return s
}

// size reads an optional, guest-given byte count (absent or negative: 0).
func size(p *int64) uint64 {
	if p == nil || *p < 0 {
		return 0
	}
	return uint64(*p)
}

// Filesystems implements sandbox.FilesystemReporter: what the guest
// reports of its filesystems (guest-reported, for the health monitor).
func (g Guest) Filesystems(ctx context.Context) ([]apitype.GuestFilesystem, error) {
	fs, err := g.a.Filesystems(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]apitype.GuestFilesystem, 0, len(fs))
	for _, f := range fs {
		out = append(out, apitype.GuestFilesystem{Mountpoint: f.Mountpoint, Type: f.Type, UsedBytes: size(f.UsedBytes), TotalBytes: size(f.TotalBytes)})
	}
	return out, nil
}
