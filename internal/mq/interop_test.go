package mq_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPythonInterop drives the independent Python client (written from the
// protocol notes, on Debian's python3-zmq and python3-msgpack) against the
// server: it stores through the shared-memory slots and reads the bytes
// back. Debian's interpreter is called explicitly: the first python3 on PATH
// may lack these modules.
func TestPythonInterop(t *testing.T) {
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import zmq and msgpack (apt-get install -y python3-zmq python3-msgpack): %v\n%s", py, err, out)
	}
	for _, profile := range []string{"gen3", "gen2m"} {
		t.Run(profile, func(t *testing.T) {
			h := start(t, opts{realShm: true})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, py, "../../scripts/interop/mp_client.py", "--endpoint", h.endpoint, "--chunks", "3", "--profile", profile)
			out, err := cmd.CombinedOutput()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			var summary struct {
				OK            bool   `json:"ok"`
				Error         string `json:"error"`
				Profile       string `json:"profile"`
				ChunkSize     int    `json:"chunk_size"`
				StoredChunks  int    `json:"stored_chunks"`
				LookupHits    int    `json:"lookup_hits"`
				VerifiedBytes int    `json:"verified_bytes"`
			}
			if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); jerr != nil || err != nil || !summary.OK {
				t.Fatalf("python client failed: %v\n%s", err, out)
			}
			if summary.Profile != profile || summary.ChunkSize != testChunk || summary.StoredChunks != 3 || summary.LookupHits != 3 || summary.VerifiedBytes != 3*testObj {
				t.Fatalf("python summary %+v", summary)
			}
			if !strings.Contains(h.logs.String(), "profile="+profile) {
				t.Errorf("server did not log choosing %s", profile)
			}
		})
	}
}
