package coordinator

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/periodic"
)

// Sentinel errors. Every handler returns an error wrapping one of these and
// apiErrors maps them to the documented status codes in this one place.
var (
	// ErrValidation is a field-level body/query failure (422, FastAPI list).
	ErrValidation = errors.New("validation failed")
	// ErrBadRequest is a semantic rejection (400, {"detail": msg}).
	ErrBadRequest = errors.New("bad request")
	// ErrNotFound is an unknown instance (404, {"detail": msg}).
	ErrNotFound = errors.New("not found")
	// ErrUnknownHeartbeat is a heartbeat from an unknown instance (404,
	// {"error": msg}, upstream's non-FastAPI shape).
	ErrUnknownHeartbeat = errors.New("unknown instance")
	// ErrUpstream is a failed call to an MP server (502).
	ErrUpstream = errors.New("upstream failure")
	// ErrTooLarge is a body over the size limit (413).
	ErrTooLarge = errors.New("request body too large")
	// ErrUnauthorized is a protected route called without the right bearer
	// token (401 {"detail": msg}, with WWW-Authenticate); the toolkit's.
	ErrUnauthorized = httproute.ErrUnauthorized
	// ErrUnknownThread is an unknown periodic loop name (404
	// {"error": msg}, the MP server's /periodic-threads shape).
	ErrUnknownThread = errors.New("unknown periodic thread")
	// ErrForbidden is pprof asked for by a non-loopback client while no
	// --auth-token is set (403 {"detail": msg}).
	ErrForbidden = errors.New("forbidden")
)

// apiErrors is the coordinator's one sentinel→status table. Unknown paths
// and wrong methods (the toolkit's ErrNoRoute and ErrMethod) are FastAPI's
// 404 and 405; anything unmapped is a bare "Internal Server Error", as
// uvicorn answers.
var apiErrors = httproute.Errors{
	Realm:        "lmcache-coordinator",
	HideInternal: true,
	Statuses: httproute.StatusMap{
		{Status: http.StatusNotFound, Errs: []error{ErrUnknownHeartbeat, ErrUnknownThread}, Shape: httproute.ShapeError},
		{Status: http.StatusUnauthorized, Errs: []error{ErrUnauthorized}, Shape: httproute.ShapeDetail},
		{Status: http.StatusForbidden, Errs: []error{ErrForbidden}},
		{Status: http.StatusNotFound, Errs: []error{ErrNotFound}},
		{Status: http.StatusBadRequest, Errs: []error{ErrBadRequest, periodic.ErrInvalidLevel}},
		{Status: http.StatusRequestEntityTooLarge, Errs: []error{ErrTooLarge, httproute.ErrBodyTooLarge}},
		{Status: http.StatusBadGateway, Errs: []error{ErrUpstream}},
		{Status: http.StatusServiceUnavailable, Errs: []error{ErrNotLeader, ErrIntentStore, registry.ErrFull}},
	},
}

// detailItem is one Pydantic v2 style validation error.
type detailItem struct {
	Type  string         `json:"type"`
	Loc   []any          `json:"loc"`
	Msg   string         `json:"msg"`
	Input any            `json:"input"`
	Ctx   map[string]any `json:"ctx,omitempty"`
}

// validationError carries the FastAPI 422 detail list.
type validationError struct{ items []detailItem }

func (e *validationError) Error() string {
	if len(e.items) == 0 {
		return ErrValidation.Error()
	}
	return fmt.Sprintf("%v: %v %s", ErrValidation, e.items[0].Loc, e.items[0].Msg)
}

func (e *validationError) Unwrap() error { return ErrValidation }

// Detail is the 422 body's list.
func (e *validationError) Detail() any { return e.items }

func invalid(items ...detailItem) error { return &validationError{items: items} }

func badRequest(format string, a ...any) error {
	return withMsg(ErrBadRequest, format, a...)
}

// withMsg wraps sentinel with a client-facing message (the body shows the
// message, not the sentinel's text).
func withMsg(sentinel error, format string, a ...any) error {
	return httproute.Errorf(sentinel, format, a...)
}

// writeError writes err with its documented status and body.
func writeError(w http.ResponseWriter, err error) {
	apiErrors.Write(w, httproute.ShapeDetail, err)
}

// writeJSON is the toolkit's writer.
var writeJSON = httproute.WriteJSON
