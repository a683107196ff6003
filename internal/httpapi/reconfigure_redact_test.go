package httpapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/fs"
)

// chattyAdapter is a reconfigurable adapter whose status and results
// carry its credentials, as an adapter reporting its own configuration
// would.
type chattyAdapter struct{ *fs.Adapter }

func (chattyAdapter) TypeName() string { return "chatty" }

func (chattyAdapter) Reconfigure(context.Context, string, map[string]any) (map[string]any, error) {
	return map[string]any{"status": "ok", "aws_secret_access_key": "chatty-secret-1", "endpoint": "https://user:chatty-secret-2@host"}, nil
}

func (chattyAdapter) ReconfigureStatus() map[string]any {
	return map[string]any{"config": map[string]any{"api_key": "chatty-secret-3"}, "state": "ok"}
}

// TestReconfigureRedacted: the /reconfigure routes pass an adapter's own
// maps through redaction, as /status and /config/adapters do: a
// credential an adapter puts in its status or a result is never in the
// response.
func TestReconfigureRedacted(t *testing.T) {
	inner, _ := newFS(t)
	e := start(t, envOpts{extraAdapt: []l2.Adapter{chattyAdapter{inner}}})
	for _, r := range []resp{
		e.expect(200, "GET", "/reconfigure/chatty/status", nil),
		e.expect(200, "POST", "/reconfigure/chatty/flush", `{}`),
	} {
		if body := string(r.body); strings.Contains(body, "chatty-secret") || !strings.Contains(body, "***REDACTED***") {
			t.Errorf("body %s: want every chatty-secret redacted", body)
		}
	}
	// What is not secret still comes through.
	st := e.expect(200, "GET", "/reconfigure/chatty/status", nil).json(t)
	if ads := st["adapters"].([]any); len(ads) != 1 || ads[0].(map[string]any)["state"] != "ok" {
		t.Errorf("status = %v", st)
	}
}
