package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors. Every handler returns an error wrapping one of these and
// writeError maps them to the documented status codes in this one place.
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
	// ErrMethod is a known path with the wrong method (405).
	ErrMethod = errors.New("method not allowed")
	// ErrNoRoute is an unknown path (404 {"detail":"Not Found"}).
	ErrNoRoute = errors.New("no route")
	// ErrUnauthorized is a protected route called without the right bearer
	// token (401 {"detail": msg}, with WWW-Authenticate).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrUnknownThread is an unknown periodic loop name (404
	// {"error": msg}, the MP server's /periodic-threads shape).
	ErrUnknownThread = errors.New("unknown periodic thread")
)

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

func invalid(items ...detailItem) error { return &validationError{items: items} }

func badRequest(format string, a ...any) error {
	return withMsg(ErrBadRequest, format, a...)
}

// msgError keeps the client-facing message apart from the sentinel text.
type msgError struct {
	sentinel error
	msg      string
}

func (e *msgError) Error() string { return e.msg }
func (e *msgError) Unwrap() error { return e.sentinel }

func withMsg(sentinel error, format string, a ...any) error {
	return &msgError{sentinel: sentinel, msg: fmt.Sprintf(format, a...)}
}

func errorMessage(err error) string {
	var m *msgError
	if errors.As(err, &m) {
		return m.msg
	}
	return err.Error()
}

// writeError is the single sentinel→status mapping.
func writeError(w http.ResponseWriter, err error) {
	var ve *validationError
	switch {
	case errors.As(err, &ve):
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": ve.items})
	case errors.Is(err, ErrUnknownHeartbeat), errors.Is(err, ErrUnknownThread):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": errorMessage(err)})
	case errors.Is(err, ErrUnauthorized):
		w.Header().Set("WWW-Authenticate", `Bearer realm="lmcache-coordinator"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": errorMessage(err)})
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": errorMessage(err)})
	case errors.Is(err, ErrNoRoute):
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	case errors.Is(err, ErrMethod):
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	case errors.Is(err, ErrBadRequest):
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": errorMessage(err)})
	case errors.Is(err, ErrTooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"detail": errorMessage(err)})
	case errors.Is(err, ErrUpstream):
		writeJSON(w, http.StatusBadGateway, map[string]string{"detail": errorMessage(err)})
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("Internal Server Error"))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("Internal Server Error"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
