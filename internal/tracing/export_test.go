package tracing

import (
	"log/slog"
	"time"
)

// NewSDKErrors is the error handler Start installs, with its clock and
// throttle interval given.
func NewSDKErrors(log *slog.Logger, every time.Duration, now func() time.Time) interface{ Handle(error) } {
	return newSDKErrors(log, every, now)
}
