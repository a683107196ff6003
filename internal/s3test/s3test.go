// Package s3test starts S3 servers for tests: a real versitygw process
// (pinned version, installed by scripts/install-versitygw.sh) on 127.0.0.1
// with a temp-dir POSIX backend, or gofakes3 in-process. Each server comes
// with a bucket and is stopped by t.Cleanup.
//
// The versitygw binary is found through $VERSITYGW (a path), then
// $GOBIN or $(go env GOPATH)/bin, then $PATH. Without it the test fails with
// a message naming the install script: the real-server proof is never
// skipped, on CI or on a laptop (scripts/test.sh installs versitygw first).
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go/build"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Region is the region every test server uses.
const Region = "us-east-1"

// Server is a running S3-compatible server.
type Server struct {
	// Kind is "versitygw" or "gofakes3".
	Kind string
	// Endpoint is "127.0.0.1:<port>" (no scheme; plain HTTP).
	Endpoint string
	// Bucket exists and is empty at start.
	Bucket    string
	AccessKey string
	SecretKey string
	// Dir is versitygw's backing directory ("" for gofakes3).
	Dir string
	// Client is a path-style client for arranging and inspecting objects.
	Client *s3.Client

	proc *os.Process // the versitygw process (nil for gofakes3)
}

// Freeze stops the versitygw process with SIGSTOP: its sockets stay open
// and accept connections, but nothing is answered, which is what a stalled
// (not dead) S3 looks like. It returns once every thread of the process is
// stopped (kill returns before that), so no request sent afterwards is
// answered. Thaw resumes it; a frozen server is still killed by the test's
// cleanup.
func (s *Server) Freeze() error {
	if err := s.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		stopped, err := allStopped(s.proc.Pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("s3test: versitygw (pid %d) not stopped 10 s after SIGSTOP", s.proc.Pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of pid is in state T (stopped),
// read from /proc/<pid>/task/*/stat.
func allStopped(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("s3test: %w", err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			return false, nil // a thread that just exited; look again
		}
		// The state follows the parenthesised command name.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("s3test: unexpected %s/%s/stat: %q", dir, task.Name(), b)
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			return false, nil
		}
	}
	return true, nil
}

// Thaw resumes a frozen versitygw with SIGCONT.
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.proc == nil {
		return fmt.Errorf("s3test: %s server has no process to signal", s.Kind)
	}
	if err := s.proc.Signal(sig); err != nil {
		return fmt.Errorf("s3test: signal versitygw: %w", err)
	}
	return nil
}

// URL is the endpoint with its scheme.
func (s *Server) URL() string { return "http://" + s.Endpoint }

// FindVersity locates the versitygw binary.
func FindVersity() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$VERSITYGW=%s: %w", p, err)
		}
		return p, nil
	}
	dirs := []string{os.Getenv("GOBIN")}
	for _, gp := range filepath.SplitList(build.Default.GOPATH) {
		dirs = append(dirs, filepath.Join(gp, "bin"))
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, "versitygw")
		if info, err := os.Stat(p); err == nil && !info.IsDir() {
			return p, nil
		}
	}
	return exec.LookPath("versitygw")
}

// Versity starts versitygw for the test; a missing binary fails the test.
func Versity(t testing.TB) *Server {
	t.Helper()
	return versity(t)
}

// VersityVirtualHosted is Versity with virtual-hosted bucket addressing
// on under domain as well as path style: a request for
// <bucket>.<domain>:<port> is routed to bucket by its Host header. Nothing
// resolves such names to 127.0.0.1, so a client dials Endpoint itself.
func VersityVirtualHosted(t testing.TB, domain string) *Server {
	t.Helper()
	return versity(t, "--virtual-domain", domain)
}

func versity(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := FindVersity()
	if err != nil {
		t.Fatalf("versitygw not found (%v); install it with scripts/install-versitygw.sh (scripts/test.sh does)", err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Kind: "versitygw", AccessKey: "lmcache-test", SecretKey: "lmcache-test-secret-" + randHex(4), Dir: data}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		s.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		// Output goes to a file (an *os.File needs no copying goroutine).
		args := append([]string{"--access", s.AccessKey, "--secret", s.SecretKey,
			"--region", Region, "--port", s.Endpoint, "--keep-alive", "--quiet"}, extra...)
		cmd := exec.Command(bin, append(args, "posix", data)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start versitygw: %v", err)
		}
		// The goroutine owns cmd.Wait; done closes when the process is gone.
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		stop := func() {
			_ = cmd.Process.Kill()
			<-done
		}
		s.Client = NewClient(s.Endpoint, s.AccessKey, s.SecretKey)
		if err := waitReady(s.Client, done); err != nil {
			s.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections()
			stop()
			if attempt < 2 {
				continue // most likely lost the port race
			}
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("versitygw did not start: %v\n%s", err, log)
		}
		s.proc = cmd.Process
		t.Cleanup(func() {
			s.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections()
			stop()
			_ = logf.Close()
		})
		break
	}
	s.Bucket = s.NewBucket(t)
	return s
}

// Fake starts gofakes3 on an httptest server.
func Fake(t testing.TB) *Server {
	t.Helper()
	return FakeWith(t, nil)
}

// FakeWith starts gofakes3 behind wrap (nil: none), so tests can inject
// failures in front of a working S3.
func FakeWith(t testing.TB, wrap func(http.Handler) http.Handler) *Server {
	t.Helper()
	var h http.Handler = gofakes3.New(s3mem.New()).Server()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	s := &Server{Kind: "gofakes3", Endpoint: ts.Listener.Addr().String(), AccessKey: "fake", SecretKey: "fake-secret"}
	s.Client = NewClient(s.Endpoint, s.AccessKey, s.SecretKey)
	t.Cleanup(s.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections)
	s.Bucket = s.NewBucket(t)
	return s
}

// NewClient returns a plain path-style SDK client for endpoint, configured
// as the adapter configures its own (no optional checksums).
func NewClient(endpoint, access, secret string) *s3.Client {
	return s3.New(s3.Options{
		Region:                     Region,
		BaseEndpoint:               aws.String("http://" + endpoint),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(access, secret, ""),
		HTTPClient:                 &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// NewBucket creates another empty bucket with a random name.
func (s *Server) NewBucket(t testing.TB) string {
	t.Helper()
	name := "lmcache-" + randHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket on %s: %v", s.Kind, err)
	}
	return name
}

// Keys lists every object name in bucket.
func (s *Server) Keys(t testing.TB, bucket string) []string {
	t.Helper()
	var names []string
	p := s3.NewListObjectsV2Paginator(s.Client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for p.HasMorePages() {
		out, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("list %s: %v", bucket, err)
		}
		for _, o := range out.Contents {
			names = append(names, aws.ToString(o.Key))
		}
	}
	return names
}

func waitReady(c *s3.Client, exited <-chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("process exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, last = c.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.Join(errors.New("timed out"), last)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
