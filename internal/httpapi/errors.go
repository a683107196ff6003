package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/lmcache-go/lmcache/internal/engine"
	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/dax"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// Sentinel errors of this package. Handlers return errors wrapping one of
// these (or an engine / l2 / objkey sentinel); statusOf is the one place
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

// statusCoder lets a lower layer (an L2 adapter's reconfigure error, for
// instance) choose its own status.
type statusCoder interface{ HTTPStatus() int }

// statusOf maps an error to its HTTP status.
func statusOf(err error) int {
	var sc statusCoder
	var ve *validationError
	switch {
	case errors.As(err, &ve):
		return http.StatusUnprocessableEntity
	case errors.As(err, &sc):
		return sc.HTTPStatus()
	case errors.Is(err, ErrNotInitialized), errors.Is(err, ErrUnavailable), errors.Is(err, l2.ErrUnavailable), errors.Is(err, engine.ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrTimeout):
		return http.StatusRequestTimeout
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrUnsupported), errors.Is(err, l2.ErrListUnsupported):
		return http.StatusNotImplemented
	case errors.Is(err, ErrConflict), errors.Is(err, dax.ErrConflict), errors.Is(err, engine.ErrNoLayout), errors.Is(err, engine.ErrWrongState):
		return http.StatusConflict
	case errors.Is(err, ErrNotFound), errors.Is(err, engine.ErrNotFound), errors.Is(err, dax.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrBadRequest), errors.Is(err, dax.ErrBadRequest), errors.Is(err, engine.ErrInvalid), errors.Is(err, engine.ErrUnsupported),
		errors.Is(err, objkey.ErrInvalid), errors.Is(err, tokenhash.ErrTokenRange), errors.Is(err, loglevel.ErrUnknownLevel):
		return http.StatusBadRequest
	case errors.Is(err, engine.ErrOutOfMemory):
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// apiError carries a client-facing message and the sentinel that decides
// its status; Error() is the message alone, so bodies do not repeat the
// sentinel's text.
type apiError struct {
	kind error
	msg  string
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.kind }

func errf(kind error, format string, args ...any) error {
	return &apiError{kind: kind, msg: fmt.Sprintf(format, args...)}
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

func invalid(typ, msg string, loc ...any) error {
	return &validationError{items: []fieldError{{Loc: loc, Msg: msg, Type: typ}}}
}

// shape is the error-body convention of a route (upstream is not uniform).
type shape int

const (
	shapeDetail shape = iota // {"detail": "..."}
	shapeError               // {"error": "..."}
	shapeText                // text/plain body
)

// scrubbed is an error whose message had secret values replaced (see
// Server.scrub); its status is still the wrapped error's.
type scrubbed struct {
	err error
	msg string
}

func (e scrubbed) Error() string { return e.msg }
func (e scrubbed) Unwrap() error { return e.err }

// writeErr writes err with the route's shape. 422 always uses FastAPI's
// detail list; 401 carries WWW-Authenticate.
func writeErr(w http.ResponseWriter, sh shape, err error) {
	code := statusOf(err)
	var ve *validationError
	if errors.As(err, &ve) {
		writeJSON(w, code, map[string]any{"detail": ve.items})
		return
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lmcache"`)
	}
	switch sh {
	case shapeError:
		writeJSON(w, code, map[string]any{"error": err.Error()})
	case shapeText:
		writeText(w, code, err.Error())
	default:
		writeJSON(w, code, map[string]any{"detail": err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b, _ = json.Marshal(map[string]any{"detail": "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func writeText(w http.ResponseWriter, code int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(s))
}
