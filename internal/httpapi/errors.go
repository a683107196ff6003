package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/periodic"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// Sentinel errors of this package. Handlers return errors wrapping one of
// these (or an engine / l2 / objkey sentinel); statusMap is the one place
// that turns them into HTTP statuses.
var (
	ErrBadRequest     = errors.New("bad request")
	ErrUnauthorized   = errors.New("unauthorized")
	ErrForbidden      = errors.New("forbidden")
	ErrTimeout        = errors.New("request timeout")
	ErrNotFound       = errors.New("not found")
	ErrConflict       = errors.New("conflict")
	ErrTooLarge       = errors.New("request body too large")
	ErrUnsupported    = errors.New("not implemented")
	ErrUnavailable    = errors.New("unavailable")
	ErrNotInitialized = errors.New("not initialized")
)

// statusMap is the one sentinel→status table of the MP server's API
// (first match wins; validation errors are 422 and errors with an
// HTTPStatus method choose their own before it is consulted).
var statusMap = httproute.StatusMap{
	{Status: http.StatusServiceUnavailable, Errs: []error{ErrNotInitialized, ErrUnavailable, l2.ErrUnavailable, engine.ErrClosed}},
	{Status: http.StatusUnauthorized, Errs: []error{ErrUnauthorized, httproute.ErrUnauthorized}},
	{Status: http.StatusForbidden, Errs: []error{ErrForbidden}},
	{Status: http.StatusRequestTimeout, Errs: []error{ErrTimeout, httproute.ErrBodyTimeout}},
	{Status: http.StatusRequestEntityTooLarge, Errs: []error{ErrTooLarge, httproute.ErrBodyTooLarge}},
	{Status: http.StatusNotImplemented, Errs: []error{ErrUnsupported, l2.ErrListUnsupported}},
	{Status: http.StatusConflict, Errs: []error{ErrConflict, dax.ErrConflict, engine.ErrNoLayout, engine.ErrWrongState}},
	{Status: http.StatusNotFound, Errs: []error{ErrNotFound, engine.ErrNotFound, dax.ErrNotFound}},
	{Status: http.StatusBadRequest, Errs: []error{ErrBadRequest, dax.ErrBadRequest, engine.ErrInvalid, engine.ErrUnsupported,
		objkey.ErrInvalid, l2.ErrBadPageToken, tokenhash.ErrTokenRange, loglevel.ErrUnknownLevel, periodic.ErrInvalidLevel, httproute.ErrBodyRead}},
	{Status: http.StatusInsufficientStorage, Errs: []error{engine.ErrOutOfMemory}},
}

// statusOf maps an error to its HTTP status.
func statusOf(err error) int { return statusMap.Status(err) }

// errf wraps kind with a client-facing message (the body shows the
// message, not the sentinel's text).
func errf(kind error, format string, args ...any) error {
	return httproute.Errorf(kind, format, args...)
}

// fieldError is one FastAPI-style validation item.
type fieldError struct {
	Loc  []any  `json:"loc"`
	Msg  string `json:"msg"`
	Type string `json:"type"`
}

// validationError is a 422 with FastAPI's {"detail": [...]} body.
type validationError struct{ items []fieldError }

func (e *validationError) Error() string {
	if len(e.items) == 0 {
		return "validation error"
	}
	return fmt.Sprintf("%v: %s", e.items[0].Loc, e.items[0].Msg)
}

// Detail is the 422 body's list.
func (e *validationError) Detail() any { return e.items }

func invalid(typ, msg string, loc ...any) error {
	return &validationError{items: []fieldError{{Loc: loc, Msg: msg, Type: typ}}}
}

// shape is the error-body convention of a route (upstream is not uniform).
type shape = httproute.Shape

const (
	shapeDetail = httproute.ShapeDetail // {"detail": "..."}
	shapeError  = httproute.ShapeError  // {"error": "..."}
	shapeText   = httproute.ShapeText   // text/plain body
)

// writeJSON and writeText are the toolkit's writers.
var (
	writeJSON = httproute.WriteJSON
	writeText = httproute.WriteText
)
