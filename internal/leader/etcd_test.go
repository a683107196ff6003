package leader_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/leader"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdBinary is Debian's etcd-server (scripts/install-deps.sh test).
const etcdBinary = "/usr/bin/etcd"

type member struct {
	name, clientURL string
	cmd             *exec.Cmd
	exited          chan struct{}
}

type cluster struct {
	members   []*member
	endpoints []string
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startCluster runs a three-member etcd cluster on loopback, killed with the
// test. A missing etcd binary fails the test.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	if _, err := os.Stat(etcdBinary); err != nil {
		t.Fatalf("%s missing (run scripts/install-deps.sh test, which installs Debian's etcd-server): %v", etcdBinary, err)
	}
	const n = 3
	dir := t.TempDir()
	peers, clients := make([]string, n), make([]string, n)
	var initial []string
	for i := range n {
		peers[i] = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		clients[i] = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	c := &cluster{endpoints: clients}
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i), clientURL: clients[i], exited: make(chan struct{})}
		logf, err := os.Create(filepath.Join(dir, m.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		m.cmd = exec.Command(etcdBinary,
			"--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", clients[i], "--advertise-client-urls", clients[i],
			"--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "lmcache-leader-test",
			"--heartbeat-interval", "100", "--election-timeout", "1000")
		m.cmd.Stdout, m.cmd.Stderr = logf, logf
		if err := m.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", m.name, err)
		}
		go func() { _ = m.cmd.Wait(); logf.Close(); close(m.exited) }()
		c.members = append(c.members, m)
		t.Cleanup(func() { m.kill(t) })
	}
	cli := newClient(t, c.endpoints)
	deadline := time.Now().Add(60 * time.Second)
	for _, ep := range c.endpoints {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := cli.Status(ctx, ep)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("etcd member %s not healthy: %v (logs in %s)", ep, err, dir)
			}
			time.Sleep(100 * time.Millisecond) // polling interval
		}
	}
	return c
}

func (m *member) kill(t *testing.T) {
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
		t.Errorf("etcd %s did not exit after SIGKILL", m.name)
	}
}

// follower returns a member that is not the raft leader.
func (c *cluster) follower(t *testing.T, cli *clientv3.Client) *member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range c.members {
		st, err := cli.Status(ctx, m.clientURL)
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

func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := leader.NewClient(endpoints, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
