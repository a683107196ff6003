package proctest

import (
	"fmt"
	"net"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// FreePort's ports lie below the kernel's ephemeral range (where no
// port-0 listener or outgoing connection of another process lands) and
// are bindable when returned.
func TestFreePortBelowEphemeral(t *testing.T) {
	low, high := belowEphemeral()
	if high <= low {
		t.Fatalf("range [%d, %d) is empty", low, high)
	}
	seen := map[int]bool{}
	for range 20 {
		p := FreePort(t)
		if p < low || p >= high {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d from FreePort is not bindable: %v", p, err)
		}
		ln.Close()
	}
	if len(seen) < 2 {
		t.Errorf("20 picks gave %d distinct ports: not random", len(seen))
	}
}
