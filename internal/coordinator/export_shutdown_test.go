package coordinator

import "net/http"

// WithBeforeClose has Run call f just before it closes the MP client and
// the HA session, so a test can check what still runs at that point.
func WithBeforeClose(f func()) Option { return func(s *Server) { s.beforeClose = f } }

// WrapHandler replaces the handler Run serves with wrap of it (call before
// Run).
func (s *Server) WrapHandler(wrap func(http.Handler) http.Handler) { s.handler = wrap(s.handler) }
