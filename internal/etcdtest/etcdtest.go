// Package etcdtest starts real etcd clusters on loopback for tests: Debian's
// etcd-server binary (scripts/install-deps.sh test installs it), three
// members by default, killed when the test ends.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/proctest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Binary is Debian's etcd-server.
const Binary = "/usr/bin/etcd"

// Member is one etcd process.
type Member struct {
	Name, ClientURL string
	log             string // stdout and stderr of the process
	cmd             *exec.Cmd
	exited          chan struct{}
}

// Cluster is a running etcd cluster.
type Cluster struct {
	Members []*Member
	// Endpoints are the members' client URLs.
	Endpoints []string
	// Dir holds the members' data directories and logs.
	Dir string
}

// startAttempts bounds how often Start picks fresh ports. FreePort closes
// its probe listener before etcd binds, so a process elsewhere on the
// machine (CI runs many test binaries at once) can take the port in
// between; the member then exits at once with "address already in use".
const startAttempts = 3

// healthyWithin is how long a started cluster may take to answer on every
// member (elections on a loaded two-core machine take seconds, not this).
const healthyWithin = 60 * time.Second

// Start runs an n-member cluster on loopback and waits until every member
// answers; a missing etcd binary fails the test (it is a declared test
// dependency, not optional hardware). A member that exits before it
// answers fails the test at once with its log's tail, unless it lost a
// port race, which is retried on fresh ports.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("%s missing (run scripts/install-deps.sh test, which installs Debian's etcd-server): %v", Binary, err)
	}
	return startPicking(t, n, proctest.FreePort)
}

// startPicking is Start with the port picker a test can replace.
func startPicking(t testing.TB, n int, freePort func(testing.TB) int) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, err := start(t, n, freePort)
		if err == nil {
			return c
		}
		for _, m := range c.Members {
			m.Kill(t)
		}
		if !errors.Is(err, errPortTaken) || attempt == startAttempts {
			t.Fatalf("etcd cluster (attempt %d of %d): %v", attempt, startAttempts, err)
		}
		t.Logf("etcd cluster attempt %d: %v; retrying on fresh ports", attempt, err)
	}
}

// errPortTaken marks a start that lost a port to another process.
var errPortTaken = errors.New("a port was taken before etcd bound it")

func start(t testing.TB, n int, freePort func(testing.TB) int) (*Cluster, error) {
	t.Helper()
	dir := t.TempDir()
	peers, clients := make([]string, n), make([]string, n)
	var initial []string
	for i := range n {
		peers[i] = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		clients[i] = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	c := &Cluster{Endpoints: clients, Dir: dir}
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i), ClientURL: clients[i], log: filepath.Join(dir, fmt.Sprintf("m%d.log", i)), exited: make(chan struct{})}
		logf, err := os.Create(m.log)
		if err != nil {
			t.Fatal(err)
		}
		m.cmd = exec.Command(Binary,
			"--name", m.Name, "--data-dir", filepath.Join(dir, m.Name),
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "lmcache-etcdtest",
			"--heartbeat-interval", "100", "--election-timeout", "1000")
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		if err := m.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", m.Name, err)
		}
		go func() { _ = m.cmd.Wait(); logf.Close(); close(m.exited) }() // ends when the process exits
		c.Members = append(c.Members, m)
		t.Cleanup(func() { m.Kill(t) })
	}
	cli := NewClient(t, c.Endpoints)
	deadline := time.Now().Add(healthyWithin)
	for _, m := range c.Members {
		for {
			select {
			case <-m.exited:
				tail := m.logTail()
				if strings.Contains(tail, "address already in use") {
					return c, fmt.Errorf("%s exited: %w:\n%s", m.Name, errPortTaken, tail)
				}
				return c, fmt.Errorf("%s exited before it answered (log %s):\n%s", m.Name, m.log, tail)
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := cli.Status(ctx, m.ClientURL)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return c, fmt.Errorf("member %s at %s not healthy after %v: %v (log %s):\n%s", m.Name, m.ClientURL, healthyWithin, err, m.log, m.logTail())
			}
			time.Sleep(100 * time.Millisecond) // polling interval
		}
	}
	return c, nil
}

// logTail is the last lines of the member's log, for failure messages.
func (m *Member) logTail() string {
	b, err := os.ReadFile(m.log)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// Kill sends SIGKILL and waits for the exit; a member already gone is left
// alone.
func (m *Member) Kill(t testing.TB) {
	t.Helper()
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("etcd %s did not exit after SIGKILL", m.Name)
	}
}

// Follower returns a member that is not the raft leader.
func (c *Cluster) Follower(t testing.TB, cli *clientv3.Client) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range c.Members {
		st, err := cli.Status(ctx, m.ClientURL)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader != st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no follower found")
	return nil
}

// Leader returns the member that is the raft leader now, as the members
// agree on it: every live member's status must name the same leader
// member id (a cluster mid-election has none; the test then fails rather
// than kill a member it only guesses leads).
func (c *Cluster) Leader(t testing.TB, cli *clientv3.Client) *Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var leaderID uint64
	byID := map[uint64]*Member{}
	for _, m := range c.Members {
		select {
		case <-m.exited:
			continue // killed earlier
		default:
		}
		st, err := cli.Status(ctx, m.ClientURL)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == 0 || (leaderID != 0 && st.Leader != leaderID) {
			t.Fatalf("etcd members disagree on the leader (%x vs %x): an election is running", leaderID, st.Leader)
		}
		leaderID = st.Leader
		byID[st.Header.MemberId] = m
	}
	if m := byID[leaderID]; m != nil {
		return m
	}
	t.Fatalf("etcd leader %x is not a live member", leaderID)
	return nil
}

// LeaderChanged reports whether a live member now names a leader other
// than old (the members elected a new one after old died).
func (c *Cluster) LeaderChanged(t testing.TB, cli *clientv3.Client, old *Member) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids := map[uint64]*Member{}
	var named []uint64
	for _, m := range c.Members {
		select {
		case <-m.exited:
			continue
		default:
		}
		st, err := cli.Status(ctx, m.ClientURL)
		if err != nil {
			return false
		}
		ids[st.Header.MemberId] = m
		named = append(named, st.Leader)
	}
	for _, id := range named {
		if m := ids[id]; m == nil || m == old {
			return false
		}
	}
	return len(named) > 0
}

// NewClient is an etcd client on endpoints, closed with the test.
func NewClient(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
