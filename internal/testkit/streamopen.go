package testkit

import (
	"net/http"
	"strings"
)

// StreamOpened is an http.RoundTripper that sends every request through
// RT (http.DefaultTransport when nil) and, when the answer to a request
// for a path ending in Suffix is 200, sends one value on Opened (made
// with a buffer of one; a value nobody took yet is not doubled). The
// event stream fixes where a stream without Last-Event-ID starts (the
// newest event) before it sends its headers, so a test that received
// from Opened knows the stream carries every event published after it:
// no sleep guesses when the stream is ready.
type StreamOpened struct {
	Suffix string
	Opened chan struct{}
	RT     http.RoundTripper
}

// NewStreamOpened watches the answers to requests for paths ending in
// suffix.
func NewStreamOpened(suffix string) *StreamOpened {
	return &StreamOpened{Suffix: suffix, Opened: make(chan struct{}, 1)}
}

// RoundTrip implements http.RoundTripper.
func (s *StreamOpened) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := s.RT
	if rt == nil {
		rt = http.DefaultTransport
	}
	resp, err := rt.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(r.URL.Path, s.Suffix) {
		select {
		case s.Opened <- struct{}{}:
		default:
		}
	}
	return resp, err
}
