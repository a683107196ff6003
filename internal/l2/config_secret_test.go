package l2

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lmcache-go/lmcache/internal/redact"
)

// TestTypeErrorsHideSecretValues: a mistyped credential's error names the
// key but not the value (these errors reach the start-up log and
// /reconfigure answers); an ordinary key's error still quotes its value.
func TestTypeErrorsHideSecretValues(t *testing.T) {
	f := NewFields(map[string]json.RawMessage{"aws_secret_access_key": json.RawMessage(`123456789`), "bucket": json.RawMessage(`42`)})
	_, err := f.String("aws_secret_access_key", "")
	if err == nil || err.Error() != "aws_secret_access_key must be a string, got "+redact.Marker {
		t.Fatalf("secret key error %q, want the key and %s", err, redact.Marker)
	}
	_, err = f.String("bucket", "")
	if err == nil || !strings.HasSuffix(err.Error(), "bucket must be a string, got 42") {
		t.Fatalf("ordinary key error %q, want its value quoted", err)
	}
}
