package script

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunLimits(t *testing.T) {
	ctx := context.Background()
	res, err := Run(ctx, Config{AllowedImports: []string{"json"}}, "a.star", `load("json", "json")
print("hi")
result = json.encode([1, 2])`)
	if err != nil || res.Text != "[1,2]" || res.Printed != "hi\n" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if res, _ := Run(ctx, Config{}, "a.star", "x = 1"); res.Text != SuccessMessage {
		t.Fatalf("no result: %q", res.Text)
	}
	if res, _ := Run(ctx, Config{}, "a.star", "result = 42"); res.Text != "42" {
		t.Fatalf("int result: %q", res.Text)
	}
	if _, err := Run(ctx, Config{}, "a.star", `load("json", "json")`); !errors.Is(err, ErrImportNotAllowed) {
		t.Fatalf("disallowed import: %v", err)
	}
	if _, err := Run(ctx, Config{AllowedImports: []string{"os"}}, "a.star", `load("os", "os")`); err == nil || !strings.Contains(err.Error(), "no module named 'os'") {
		t.Fatalf("unknown module: %v", err)
	}
	if _, err := Run(ctx, Config{MaxSteps: 1000}, "a.star", "for i in range(100000):\n  pass"); err == nil || !strings.Contains(err.Error(), "too many steps") {
		t.Fatalf("steps: %v", err)
	}
	if _, err := Run(ctx, Config{MaxSteps: 1 << 40, Timeout: 50 * time.Millisecond}, "a.star", "while True:\n  pass"); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("deadline: %v", err)
	}
	if _, err := Run(ctx, Config{MaxOutput: 10}, "a.star", "for i in range(100):\n  print('xxxxx')"); !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("print cap: %v", err)
	}
	if _, err := Run(ctx, Config{MaxOutput: 10}, "a.star", "result = 'y' * 100"); !errors.Is(err, ErrOutputLimit) {
		t.Fatalf("result cap: %v", err)
	}
	if _, err := Run(ctx, Config{}, "a.star", "result = ("); err == nil {
		t.Fatal("syntax error accepted")
	}
}

func TestFromGoIsFrozen(t *testing.T) {
	v, err := FromGo(map[string]any{"a": []any{int64(1), "x", nil, true, 2.5}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Config{Globals: starlark.StringDict{"d": v}}, "a.star", `d["b"] = 1`)
	if err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("mutation of host data: %v", err)
	}
	if _, err := FromGo(struct{}{}); err == nil {
		t.Fatal("struct accepted")
	}
}
