package httproute

import (
	"net/http"

	"github.com/lmcache-go/lmcache/internal/periodic"
)

// PeriodicHandlers serve the three background-loop routes both services
// expose over their periodic.Registry: GET /periodic-threads (List),
// GET /periodic-threads/{thread_name} (Get) and GET
// /periodic-threads-health (Health).
type PeriodicHandlers struct {
	List, Get, Health func(http.ResponseWriter, *http.Request) error
}

// Periodic returns the loop routes' handlers over reg. An unknown
// thread_name is answered with an error wrapping notFound (each service
// maps its own sentinel to its 404 body); an unknown level= filter with
// the registry's error wrapping periodic.ErrInvalidLevel.
func Periodic(reg *periodic.Registry, notFound error) PeriodicHandlers {
	return PeriodicHandlers{
		List: func(w http.ResponseWriter, r *http.Request) error {
			l, err := reg.List(Query(r))
			if err != nil {
				return err
			}
			WriteJSON(w, http.StatusOK, l)
			return nil
		},
		Get: func(w http.ResponseWriter, r *http.Request) error {
			name := r.PathValue("thread_name")
			st, ok := reg.Get(name)
			if !ok {
				return Errorf(notFound, "Thread not found: %s", name)
			}
			WriteJSON(w, http.StatusOK, st)
			return nil
		},
		Health: func(w http.ResponseWriter, _ *http.Request) error {
			WriteJSON(w, http.StatusOK, reg.Health())
			return nil
		},
	}
}

// PeriodicQuery documents GET /periodic-threads' query parameters.
func PeriodicQuery() []Param {
	levels := make([]string, len(periodic.Levels))
	for i, l := range periodic.Levels {
		levels[i] = string(l)
	}
	return []Param{{Name: "level", Enum: levels}, {Name: "running_only", Type: "boolean", Default: false}, {Name: "active_only", Type: "boolean", Default: false}}
}
