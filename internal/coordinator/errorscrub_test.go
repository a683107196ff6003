package coordinator_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/coordinator/config"
	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestHandlerErrorBodiesScrubbedCentrally: the route table's OnError hides
// both configured tokens in every handler error's body, with the status
// the wrapped error decides. The prefetch relay's 502s carry MP-server
// text and no longer scrub it themselves, so each case below leaks a
// token without the central scrub: an MP server that answers the submit
// with an error echoing --mp-auth-token and --auth-token, and a status
// poll whose transport error quotes the request-derived URL (a request id
// equal to --auth-token).
func TestHandlerErrorBodiesScrubbedCentrally(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cache/prefetches", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, `{"detail":"rejected Bearer %s (coordinator %s)"}`, mpToken, coordToken)
	})
	mux.HandleFunc("GET /cache/prefetches/{id}", func(w http.ResponseWriter, _ *http.Request) {
		// No reply at all: the coordinator's client gets EOF, an error
		// whose text quotes the URL it asked for.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
	})
	mp := httptest.NewServer(mux)
	defer mp.Close()
	port, err := strconv.Atoi(mp.URL[strings.LastIndex(mp.URL, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}

	c := startCoord(t, func(cfg *config.Config) { cfg.AuthToken, cfg.MPAuthToken = coordToken, mpToken })
	c.must("POST", "/instances", map[string]any{"instance_id": "mp-1", "ip": "127.0.0.1", "http_port": port}, 200)

	for _, tc := range []struct {
		name, method, path string
		body               any
		want               string
	}{
		{"submit error echoes both tokens", "POST", "/cache/prefetches",
			map[string]any{"instance_id": "mp-1", "model_name": "m", "world_size": 1, "token_ids": []int{1, 2, 3, 4}},
			`prefetch submit to 'mp-1' failed: server answered 500: {"detail":"rejected Bearer ` + redact.Marker + ` (coordinator ` + redact.Marker + `)"}`},
		{"poll transport error quotes the request id", "GET", "/cache/prefetches/mp-1/" + coordToken, nil,
			`prefetch status from 'mp-1' failed: Get "` + mp.URL + `/cache/prefetches/` + redact.Marker + `": EOF`},
	} {
		code, raw := c.do(tc.method, tc.path, tc.body)
		var got map[string]string
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%s: body %s: %v", tc.name, raw, err)
		}
		if code != http.StatusBadGateway || len(got) != 1 || got["detail"] != tc.want {
			t.Errorf("%s: %d %s\nwant 502 detail %s", tc.name, code, raw, tc.want)
		}
		if strings.Contains(string(raw), coordToken) || strings.Contains(string(raw), mpToken) {
			t.Errorf("%s: a token in the body: %s", tc.name, raw)
		}
	}
}
