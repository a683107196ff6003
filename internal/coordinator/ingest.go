package coordinator

import (
	"net/http"

	"github.com/lmcache-go/lmcache/internal/coordinator/eventgate"
)

// IngestCacheEvents offers a POST /events body (also the value of an
// upstream Kafka cache-event record) to the event gate, exactly as the HTTP
// door does: the whole body is validated first (an error wrapping
// ErrValidation rejects it with nothing applied), then each batch is
// admitted or dropped in list order. It returns the batch counts the HTTP
// reply carries. For an event source other than HTTP (kafkaevents.Source).
func (s *Server) IngestCacheEvents(body []byte) (applied, duplicates, stale int, err error) {
	// No Content-Type: the body is read as JSON, as FastAPI does.
	batches, err := decodeAnyCacheEvents(&http.Request{Header: http.Header{}}, body)
	if err != nil {
		return 0, 0, 0, err
	}
	for i := range batches {
		switch s.offer(&batches[i]) {
		case eventgate.Admitted:
			applied++
		case eventgate.Duplicate:
			duplicates++
		case eventgate.Stale:
			stale++
		}
	}
	return applied, duplicates, stale, nil
}
