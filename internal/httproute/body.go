package httproute

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"time"
)

// ReadBody reads at most limit bytes of r's body into buf. With a
// positive deadline the client must have sent the body by then (a client
// trickling bytes cannot hold a connection slot for ever); writers that
// do not support deadlines (httptest recorders) get only the size bound.
// Errors wrap ErrBodyTooLarge, ErrBodyTimeout or ErrBodyRead.
func ReadBody(buf *bytes.Buffer, w http.ResponseWriter, r *http.Request, limit int64, deadline time.Duration) error {
	if deadline > 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(deadline))
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	// A declared length over the limit is refused before a byte is read,
	// so an oversized upload costs neither the transfer nor a parse.
	if r.ContentLength > limit {
		return Errorf(ErrBodyTooLarge, "request body exceeds %d bytes", limit)
	}
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength))
	}
	if _, err := buf.ReadFrom(r.Body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return Errorf(ErrBodyTooLarge, "request body exceeds %d bytes", limit)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Errorf(ErrBodyTimeout, "request body not received within the read deadline")
		}
		return &Error{Kind: ErrBodyRead, Msg: "reading request body: " + err.Error()}
	}
	return nil
}
