// Package logtest is test support: a log sink that handlers on several
// goroutines may write to while a test reads what they wrote.
package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects log output. Its methods may be called concurrently: a
// server's goroutines write through a slog handler while the test reads.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Has reports whether s was written (within one Write or across several).
func (b *Buffer) Has(s string) bool {
	return strings.Contains(b.String(), s)
}
