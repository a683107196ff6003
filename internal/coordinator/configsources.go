package coordinator

import (
	"net/http"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
)

// ConfigResponse is GET /config: every setting under "coordinator" and,
// under "_sources", where each came from ("default", "flag:--port",
// "env:LMCACHE_MP_COORDINATOR_PORT", "file:/etc/lmcache/coordinator.yaml";
// "unknown" for a server built in code), the shape of `lmcache server`'s
// GET /config with its one group. Secrets are hidden (config.View).
type ConfigResponse map[string]map[string]any

// handleConfig serves config.View of the running configuration. It is a
// token route: the values name the fleet's endpoints and files, which an
// anonymous caller has no need to read.
func (s *Server) handleConfig(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, config.View(s.cfg))
	return nil
}
