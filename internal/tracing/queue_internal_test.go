package tracing

import (
	"strconv"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestQueueSizeBounded: OTEL_BSP_MAX_QUEUE_SIZE is taken as given up to
// maxQueueSize and clamped past it (the batch processor allocates twice
// the size at start, so 2^40 would crash the process); a value that is
// not a positive integer gives the SDK's default.
func TestQueueSizeBounded(t *testing.T) {
	for env, want := range map[string]int{
		"64":                           64,
		strconv.Itoa(maxQueueSize):     maxQueueSize,
		strconv.Itoa(maxQueueSize + 1): maxQueueSize,
		strconv.FormatInt(1<<40, 10):   maxQueueSize,
		"0":                            sdktrace.DefaultMaxQueueSize,
		"-5":                           sdktrace.DefaultMaxQueueSize,
		"many":                         sdktrace.DefaultMaxQueueSize,
	} {
		t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", env)
		if got := queueSize(); got != want {
			t.Errorf("OTEL_BSP_MAX_QUEUE_SIZE=%s: queue size %d, want %d", env, got, want)
		}
	}
}
