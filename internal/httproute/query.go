package httproute

import (
	"net/http"
	"net/url"
)

// Query is r's query string for handlers that read scalar parameters: each
// parameter that appears more than once keeps only its LAST value. Both
// services re-implement FastAPI routes, and FastAPI (Starlette's
// QueryParams, a multi-dict whose item lookup returns the last value)
// binds a repeated scalar parameter such as ?tier=bad&tier=l2 to the last
// occurrence, while url.Values.Get returns the first. Reading every scalar
// through Query keeps the two services answering as upstream does, and
// keeps a route's auth decision (Route.AuthWhen) and its handler reading
// the same value, so one cannot be steered by a value the other ignores.
// Has still reports presence; the result is a fresh map the caller may
// keep.
func Query(r *http.Request) url.Values {
	q := r.URL.Query()
	for k, vs := range q {
		if len(vs) > 1 {
			q[k] = vs[len(vs)-1:]
		}
	}
	return q
}
