package proctest

import (
	"fmt"
	"net"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// FreePort's ports lie below the kernel's ephemeral range (where no
// port-0 listener or outgoing connection of another process lands) and
// are bindable when returned (TestFreePortHandsOutOnce shows each is
// handed out once).
func TestFreePortBelowEphemeral(t *testing.T) {
	low, high := belowEphemeral()
	if high <= low {
		t.Fatalf("range [%d, %d) is empty", low, high)
	}
	for range 20 {
		p := FreePort(t)
		if p < low || p >= high {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d from FreePort is not bindable: %v", p, err)
		}
		ln.Close()
	}
}

// A port is handed out once per process: a range of four ports gives four
// distinct ports, and then the kernel's choice, outside it.
func TestFreePortHandsOutOnce(t *testing.T) {
	low := quietRange(t, 4)
	high := low + 4
	seen := map[int]bool{}
	for range high - low {
		p := freePortIn(t, low, high)
		if p < low || p >= high || seen[p] {
			t.Fatalf("pick %d: port %d (seen %v), want a new one in [%d, %d)", len(seen)+1, p, seen, low, high)
		}
		seen[p] = true
	}
	if p := freePortIn(t, low, high); p >= low && p < high {
		t.Fatalf("fifth pick from a four-port range: %d again, want the kernel's choice", p)
	}
}

// quietRange is the start of n consecutive ports below the ephemeral
// range that are bindable now and that FreePort has not handed out.
func quietRange(t *testing.T, n int) int {
	t.Helper()
	low, high := belowEphemeral()
next:
	for base := low; base+n <= high; base += n {
		for p := base; p < base+n; p++ {
			if _, out := handedOut.Load(p); out {
				continue next
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue next
			}
			ln.Close()
		}
		return base
	}
	t.Fatalf("no %d free consecutive ports in [%d, %d)", n, low, high)
	return 0
}
