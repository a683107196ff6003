package httproute

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Sentinels the toolkit itself returns. Each service lists them in its
// StatusMap next to its own sentinels, so the one table decides every
// status.
var (
	// ErrUnauthorized: a guarded route without the right bearer token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrNoRoute: no route has this path (FastAPI's 404 "Not Found").
	ErrNoRoute = errors.New("no route")
	// ErrMethod: the path exists under other methods (FastAPI's 405).
	ErrMethod = errors.New("method not allowed")
	// ErrBodyTooLarge: ReadBody saw more than the route's limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrBodyTimeout: ReadBody's deadline passed before the body arrived.
	ErrBodyTimeout = errors.New("request body timeout")
	// ErrBodyRead: the connection failed while the body was read.
	ErrBodyRead = errors.New("request body unreadable")
	// ErrPanic: a handler panicked (recovered; answered as an internal
	// error).
	ErrPanic = errors.New("internal error")
)

// Error is a client-facing message with the sentinel that decides its
// status. Error() is the message alone, so a body never repeats the
// sentinel's own text.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Kind }

// Errorf wraps kind with a formatted client-facing message.
func Errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Message is the client-facing text of err: the message of the outermost
// *Error in its chain, else err.Error().
func Message(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return err.Error()
}

// Validation is an error answered as 422 with FastAPI's
// {"detail": [...]} body; Detail is the list (each service keeps the item
// shape its upstream uses).
type Validation interface {
	error
	Detail() any
}

// StatusCoder lets a lower layer (an L2 adapter's reconfigure error)
// choose its own status.
type StatusCoder interface{ HTTPStatus() int }

// Shape is the error-body convention of a route or of one error kind
// (upstream is not uniform).
type Shape int

const (
	// ShapeRoute, on a StatusRule, means "the route's shape".
	ShapeRoute Shape = iota
	// ShapeDetail is {"detail": "..."} (FastAPI's HTTPException).
	ShapeDetail
	// ShapeError is {"error": "..."}.
	ShapeError
	// ShapeText is a text/plain body.
	ShapeText
)

// String names the shape as the route tables of docs/security.md do.
func (s Shape) String() string {
	switch s {
	case ShapeError:
		return "error"
	case ShapeText:
		return "text"
	}
	return "detail"
}

// StatusRule maps errors wrapping any of Errs to Status. A non-zero Shape
// overrides the route's body shape for these errors.
type StatusRule struct {
	Status int
	Errs   []error
	Shape  Shape
}

// StatusMap is a service's one sentinel→status table, first match wins.
// Validation errors are 422 and StatusCoder errors choose their own status
// before the table is consulted; an error no rule matches is 500.
type StatusMap []StatusRule

// Lookup returns err's status and the shape override (ShapeRoute for none).
func (m StatusMap) Lookup(err error) (int, Shape) {
	var v Validation
	if errors.As(err, &v) {
		return http.StatusUnprocessableEntity, ShapeDetail
	}
	var sc StatusCoder
	if errors.As(err, &sc) {
		return sc.HTTPStatus(), ShapeRoute
	}
	for _, r := range m {
		for _, e := range r.Errs {
			if errors.Is(err, e) {
				return r.Status, r.Shape
			}
		}
	}
	return http.StatusInternalServerError, ShapeRoute
}

// Status returns err's status.
func (m StatusMap) Status(err error) int {
	code, _ := m.Lookup(err)
	return code
}

// DetailBody is FastAPI's HTTPException body.
type DetailBody struct {
	Detail string `json:"detail"`
}

// ErrorBody is the {"error": ...} body some upstream routes use.
type ErrorBody struct {
	Error string `json:"error"`
}

// WriteJSON writes v as a JSON response. A value that cannot be encoded is
// a 500 (a programming error, never client input).
func WriteJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteText(w, http.StatusInternalServerError, "Internal Server Error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// WriteText writes a text/plain response.
func WriteText(w http.ResponseWriter, code int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(s))
}

func asValidation(err error) (Validation, bool) {
	var v Validation
	ok := errors.As(err, &v)
	return v, ok
}

// Errors is a service's one place that turns errors into statuses and
// bodies.
type Errors struct {
	// Statuses is the service's sentinel→status table; the toolkit's own
	// sentinels (ErrUnauthorized, ErrNoRoute, ...) follow it.
	Statuses StatusMap
	// Realm is the WWW-Authenticate realm of 401 answers.
	Realm string
	// HideInternal answers unmapped errors (500) with a fixed
	// "Internal Server Error" text instead of the error's message.
	HideInternal bool
}

// baseRules map the toolkit's own sentinels; they follow the service's.
var baseRules = StatusMap{
	{Status: http.StatusUnauthorized, Errs: []error{ErrUnauthorized}},
	{Status: http.StatusNotFound, Errs: []error{ErrNoRoute}, Shape: ShapeDetail},
	{Status: http.StatusMethodNotAllowed, Errs: []error{ErrMethod}, Shape: ShapeDetail},
	{Status: http.StatusRequestEntityTooLarge, Errs: []error{ErrBodyTooLarge}},
	{Status: http.StatusRequestTimeout, Errs: []error{ErrBodyTimeout}},
	{Status: http.StatusBadRequest, Errs: []error{ErrBodyRead}},
}

func (e *Errors) lookup(err error) (int, Shape) {
	code, sh := e.Statuses.Lookup(err)
	if code == http.StatusInternalServerError {
		if c, s := baseRules.Lookup(err); c != http.StatusInternalServerError {
			return c, s
		}
	}
	return code, sh
}

// Status maps err to its HTTP status: the service's table, then the
// toolkit's sentinels, else 500.
func (e *Errors) Status(err error) int {
	code, _ := e.lookup(err)
	return code
}

// Write writes err with its status in shape (unless its rule names one).
// 422 always uses FastAPI's detail list; 401 carries WWW-Authenticate.
func (e *Errors) Write(w http.ResponseWriter, shape Shape, err error) {
	code, sh := e.lookup(err)
	if v, ok := asValidation(err); ok {
		WriteJSON(w, code, struct {
			Detail any `json:"detail"`
		}{v.Detail()})
		return
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="`+e.Realm+`"`)
	}
	if code == http.StatusInternalServerError && e.HideInternal {
		WriteText(w, code, "Internal Server Error")
		return
	}
	if sh == ShapeRoute {
		sh = shape
	}
	msg := Message(err)
	switch sh {
	case ShapeError:
		WriteJSON(w, code, ErrorBody{msg})
	case ShapeText:
		WriteText(w, code, msg)
	default:
		WriteJSON(w, code, DetailBody{msg})
	}
}
