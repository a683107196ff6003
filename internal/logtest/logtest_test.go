package logtest

import (
	"fmt"
	"sync"
	"testing"
)

// TestBufferConcurrentWrites: lines written from several goroutines all
// arrive whole, and Has finds one.
func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "g%d line %d\n", g, i)
			}
		}()
	}
	wg.Wait()
	if n := len(b.String()); n != 8*(100*len("gX line NN\n")-10) {
		t.Errorf("%d bytes written, want %d", n, 8*(100*len("gX line NN\n")-10))
	}
	if !b.Has("g7 line 99\n") || b.Has("g8 line") {
		t.Errorf("Has: %v %v", b.Has("g7 line 99\n"), b.Has("g8 line"))
	}
}
