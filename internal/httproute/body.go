package httproute

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// ScaledDeadline is the time a client has to send a body of up to limit
// bytes: per for every started unit bytes (at least one unit), so a large
// upload is not cut off by one fixed deadline while a trickling client
// still cannot hold a connection slot for ever.
func ScaledDeadline(per time.Duration, unit, limit int64) time.Duration {
	if unit <= 0 {
		return per
	}
	units := max(1, (limit+unit-1)/unit)
	return per * time.Duration(units)
}

// LimitBody bounds r's body to limit bytes and, with a positive deadline,
// sets the connection's read deadline (writers that do not support
// deadlines, httptest recorders, get only the size bound). A declared
// length over the limit is refused at once, with an error wrapping
// ErrBodyTooLarge, so an oversized upload costs neither the transfer nor a
// parse. Handlers that stream the body (and so cannot use ReadBody) call
// this and map their read errors with BodyError.
func LimitBody(w http.ResponseWriter, r *http.Request, limit int64, deadline time.Duration) error {
	if deadline > 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(deadline))
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength > limit {
		return Errorf(ErrBodyTooLarge, "request body exceeds %d bytes", limit)
	}
	return nil
}

// BodyError maps an error from reading a body bounded by LimitBody to the
// toolkit's sentinels: over the limit wraps ErrBodyTooLarge, a passed read
// deadline ErrBodyTimeout, anything else ErrBodyRead. nil stays nil.
func BodyError(err error) error {
	if err == nil {
		return nil
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return Errorf(ErrBodyTooLarge, "request body exceeds %d bytes", mbe.Limit)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Errorf(ErrBodyTimeout, "request body not received within the read deadline")
	}
	return &Error{Kind: ErrBodyRead, Msg: "reading request body: " + err.Error()}
}

// ReadBody reads at most limit bytes of r's body into buf within deadline
// (see LimitBody). Errors wrap ErrBodyTooLarge, ErrBodyTimeout or
// ErrBodyRead.
func ReadBody(buf *bytes.Buffer, w http.ResponseWriter, r *http.Request, limit int64, deadline time.Duration) error {
	if err := LimitBody(w, r, limit, deadline); err != nil {
		return err
	}
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(r.Body)
	return BodyError(err)
}

// ErrTrailingJSON is a JSON body with data after its one value: another
// value, or a stray closing delimiter.
var ErrTrailingJSON = errors.New("trailing data after the JSON value")

// DecodeJSON decodes exactly one JSON value of b into v, numbers as
// json.Number, for the request bodies of both services. json.Decoder.More
// alone is not the end-of-input check: it reports false at a closing
// delimiter, so {"limit_gb": 1}] or {...}} passed as one object; the next
// token must be the end of input, else the error is ErrTrailingJSON.
func DecodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return ErrTrailingJSON
	}
	return nil
}
