package pveemu

import (
	"fmt"
	"net/http"
	"strings"
)

// apiError is an error answered the way pve-http-server does: the status
// code, the message as the reason phrase (first line) and in the body's
// "message", and per-parameter errors for 400.
type apiError struct {
	code   int
	msg    string // newline-terminated like Perl's die messages
	errors ParamErrors
	// bare errors are answered without a JSON body (authentication
	// failures raised before the API handler runs).
	bare bool
	// text errors are answered with the message as a plain-text body
	// (pve-http-server's error: `$content //= $msg`).
	text bool
	// answer marks a parameter exception that is the call's answer to a
	// well-formed request (paramAnswer), not a refusal of the request's
	// parameters: it is no violation.
	answer bool
}

func (e *apiError) Error() string { return strings.TrimSuffix(e.msg, "\n") }

// fail is a plain "die" in a handler: 500 with the message.
func fail(format string, a ...any) error {
	return &apiError{code: http.StatusInternalServerError, msg: fmt.Sprintf(format, a...) + "\n"}
}

// paramFail is raise_param_exc.
func paramFail(errs ParamErrors) error {
	return &apiError{code: http.StatusBadRequest, msg: "Parameter verification failed.\n", errors: errs}
}

// paramAnswer is raise_param_exc as the documented answer of a call
// asked a question, such as GET /cluster/nextid?vmid=N for a taken id:
// the same 400, but the client did nothing wrong (no violation).
func paramAnswer(errs ParamErrors) error {
	e := paramFail(errs).(*apiError)
	e.answer = true
	return e
}

// permFail is raise_perm_exc.
func permFail(what string) error {
	msg := "Permission check failed"
	if what != "" {
		msg += " (" + what + ")"
	}
	return &apiError{code: http.StatusForbidden, msg: msg + "\n"}
}

func asAPIError(err error) *apiError {
	if ae, ok := err.(*apiError); ok {
		return ae
	}
	return &apiError{code: http.StatusInternalServerError, msg: strings.TrimSuffix(err.Error(), "\n") + "\n"}
}

// lockFail wraps an error raised inside a config lock the way
// pve-network's lock_sdn_domain and pve-access-control's lock_user_config
// do: a plain die "<errmsg>: <error>", so a 500 whatever the inner error
// was; a parameter exception is stringified (PVE::Exception stringify:
// "400 Parameter verification failed.\n" and one "param: message" line
// per error).
func lockFail(errmsg string, err error) error {
	ae := asAPIError(err)
	inner := ae.msg
	if ae.code == http.StatusBadRequest {
		inner = "400 " + inner
		for _, k := range sortedKeys(ae.errors) {
			inner += k + ": " + strings.TrimSuffix(ae.errors[k], "\n") + "\n"
		}
	}
	return &apiError{code: http.StatusInternalServerError, msg: errmsg + ": " + inner}
}
