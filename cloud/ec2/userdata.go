package ec2

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"net/url"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Paths on the node the user-data writes.
const (
	ConfigPath = "/etc/pve-bootstrap/config.toml"
	BinaryPath = "/usr/local/bin/pve-bootstrap"
	// MaxUserData is EC2's user-data limit, applied to the encoded form.
	MaxUserData = 16 * 1024
	// boundary is fixed so the rendered document is reproducible.
	boundary = "pve-bootstrap-5c1d7e2a9f"
	// ShellPartName sorts after cloud-init's "runcmd" script.
	ShellPartName = "zz-pve-bootstrap-apply.sh"
)

// UserData is what the user-data carries.
type UserData struct {
	// Config is the node's recipe configuration (TOML).
	Config []byte
	// BinaryURL is where the node downloads pve-bootstrap.
	BinaryURL string
	// BinarySHA256 is the download's sha256 (hex).
	BinarySHA256 string
}

// ErrTooLarge is returned when the encoded user-data exceeds MaxUserData.
var ErrTooLarge = errors.New("user-data too large")

func (u UserData) validate() error {
	if len(u.Config) == 0 {
		return errors.New("user-data: empty node config")
	}
	pu, err := url.Parse(u.BinaryURL)
	if err != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
		return fmt.Errorf("user-data: binary URL %q: want an http(s) URL", u.BinaryURL)
	}
	if b, err := hex.DecodeString(u.BinarySHA256); err != nil || len(b) != 32 || strings.ToLower(u.BinarySHA256) != u.BinarySHA256 {
		return fmt.Errorf("user-data: binary sha256 %q: want 64 lowercase hex digits", u.BinarySHA256)
	}
	return nil
}

type writeFile struct {
	Path        string `yaml:"path"`
	Owner       string `yaml:"owner"`
	Permissions string `yaml:"permissions"`
	Content     string `yaml:"content"`
}

type cloudConfig struct {
	// The recipe owns the host name and /etc/hosts; cloud-init must not
	// rewrite them on every boot.
	PreserveHostname bool        `yaml:"preserve_hostname"`
	ManageEtcHosts   bool        `yaml:"manage_etc_hosts"`
	WriteFiles       []writeFile `yaml:"write_files"`
	Runcmd           [][]string  `yaml:"runcmd"`
}

// CloudConfig renders the cloud-config part.
func CloudConfig(u UserData) ([]byte, error) {
	if err := u.validate(); err != nil {
		return nil, err
	}
	part := BinaryPath + ".download"
	cc := cloudConfig{
		PreserveHostname: true,
		ManageEtcHosts:   false,
		WriteFiles: []writeFile{{
			Path: ConfigPath, Owner: "root:root", Permissions: "0600", Content: string(u.Config),
		}},
		Runcmd: [][]string{
			{"curl", "--fail", "--silent", "--show-error", "--location", "--retry", "5", "--output", part, u.BinaryURL},
			// sha256 and paths are validated hex and constants: no injection.
			{"sh", "-c", fmt.Sprintf("echo '%s  %s' | sha256sum --check --strict --quiet - && install -m 0755 %s %s; rm -f %s",
				u.BinarySHA256, part, part, BinaryPath, part)},
		},
	}
	var b bytes.Buffer
	b.WriteString("#cloud-config\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(cc); err != nil {
		return nil, fmt.Errorf("render cloud-config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render cloud-config: %w", err)
	}
	return b.Bytes(), nil
}

// ShellPart is the script part that runs the recipe.
func ShellPart() []byte {
	return []byte(`#!/bin/sh
# pve-bootstrap: run the recipe; after each reboot a oneshot unit resumes it.
set -eu
exec ` + BinaryPath + ` node apply --config ` + ConfigPath + `
`)
}

// Render renders the multipart user-data document.
func Render(u UserData) ([]byte, error) {
	cc, err := CloudConfig(u)
	if err != nil {
		return nil, err
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if err := mw.SetBoundary(boundary); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		ctype, name string
		data        []byte
	}{
		{"text/cloud-config", "pve-bootstrap.cfg", cc},
		{"text/x-shellscript", ShellPartName, ShellPart()},
	} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", p.ctype+`; charset="utf-8"`)
		h.Set("Content-Transfer-Encoding", "7bit")
		h.Set("Content-Disposition", `attachment; filename="`+p.name+`"`)
		w, err := mw.CreatePart(h)
		if err != nil {
			return nil, fmt.Errorf("render user-data: %w", err)
		}
		if _, err := w.Write(p.data); err != nil {
			return nil, fmt.Errorf("render user-data: %w", err)
		}
	}
	if err := mw.Close(); err != nil {
		return nil, fmt.Errorf("render user-data: %w", err)
	}
	head := "Content-Type: multipart/mixed; boundary=\"" + boundary + "\"\nMIME-Version: 1.0\n\n"
	return append([]byte(head), body.Bytes()...), nil
}

// Encode gzips and base64-encodes rendered user-data for RunInstances and
// fails when the result is over MaxUserData.
func Encode(raw []byte) (string, error) {
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	if _, err := zw.Write(raw); err != nil {
		return "", fmt.Errorf("gzip user-data: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("gzip user-data: %w", err)
	}
	s := base64.StdEncoding.EncodeToString(z.Bytes())
	if len(s) > MaxUserData {
		return "", fmt.Errorf("%w: %d bytes encoded, EC2 allows %d", ErrTooLarge, len(s), MaxUserData)
	}
	return s, nil
}

// Decode reverses Encode (tests, and inspecting a launched instance).
func Decode(s string) ([]byte, error) {
	z, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("decode user-data: %w", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		return nil, fmt.Errorf("decode user-data: %w", err)
	}
	var out bytes.Buffer
	if _, err := out.ReadFrom(zr); err != nil {
		return nil, fmt.Errorf("decode user-data: %w", err)
	}
	return out.Bytes(), nil
}
