package deploy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lmcache-go/lmcache/internal/proctest"
)

// repoRoot is the module root; go test runs in deploy/.
const repoRoot = ".."

// TestMain removes the built binary after the run and checks for leaked
// goroutines.
func TestMain(m *testing.M) { proctest.Main(m) }

// lmcacheBin is the binary built once for this test process, and the HEAD
// revision it was built at.
func lmcacheBin(t *testing.T) (string, string) {
	t.Helper()
	return proctest.Binary(t)
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	return proctest.FreePort(t)
}

// proc is one running lmcache process (internal/proctest).
type proc = proctest.Proc

// start runs the binary; cleanup stops it and requires a clean exit.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, name, nil, args...)
}

// startEnv is start with extra environment variables.
func startEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, name, env, args...)
}

// waitOK polls url until it answers 200, failing after a minute or when
// the process exits.
func waitOK(t *testing.T, p *proc, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.Done():
			t.Fatalf("process exited (%v) before %s answered 200", p.Err(), url)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within a minute (last error %v)", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// metricFamilies fetches a /metrics page and parses it with Prometheus'
// own text-format parser.
func metricFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d", url, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// metricValues sums each metric family's samples (a histogram's under
// name_count and name_sum) on a /metrics page; name#series is the number
// of series.
func metricValues(t *testing.T, url string) map[string]float64 {
	t.Helper()
	fams := metricFamilies(t, url)
	out := map[string]float64{}
	for n, f := range fams {
		for _, m := range f.GetMetric() {
			out[n+"#series"]++
			switch {
			case m.GetHistogram() != nil:
				out[n+"_count"] += float64(m.GetHistogram().GetSampleCount())
				out[n+"_sum"] += m.GetHistogram().GetSampleSum()
			case m.GetCounter() != nil:
				out[n] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[n] += m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// metricNames are the metric family names a /metrics page exposes, parsed
// with Prometheus' own text-format parser, plus a histogram's _bucket, _sum
// and _count series names (a summary's _sum and _count).
func metricNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	fams := metricFamilies(t, url)
	out := map[string]bool{}
	for n, f := range fams {
		out[n] = true
		if t := f.GetType().String(); t == "HISTOGRAM" || t == "SUMMARY" { // queries name the series
			out[n+"_bucket"], out[n+"_sum"], out[n+"_count"] = t == "HISTOGRAM", true, true
		}
	}
	return out
}

// runBin runs the binary to completion with a deadline.
func runBin(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin, _ := lmcacheBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// fleet is a real coordinator and a real server registered with it, both
// started from the Kubernetes manifests' arguments with loopback addresses
// and free ports substituted.
type fleet struct {
	serverHTTP, serverZMQ, coordHTTP string
	shmName                          string
}

var itoa = strconv.Itoa
