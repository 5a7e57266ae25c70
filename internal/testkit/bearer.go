package testkit

import "net/http"

// Bearer is an http.RoundTripper that sends every request through RT
// (http.DefaultTransport when nil) with "Authorization: Bearer Token".
type Bearer struct {
	Token string
	RT    http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Token)
	rt := b.RT
	if rt == nil {
		rt = http.DefaultTransport
	}
	return rt.RoundTrip(r)
}
