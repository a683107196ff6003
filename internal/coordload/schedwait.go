package coordload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A request that takes 250 ms on a loaded 2-core machine may be the
// coordinator working or the coordinator (or this client) waiting for a
// CPU. Linux counts the second per thread: the run-queue wait, the second
// field of /proc/PID/task/TID/schedstat. A waitSampler reads it for both
// processes every sampleEvery, so each slow request can be split into
// "time the server was runnable but not running" and the rest.

// sampleEvery is the waitSampler's period: short next to the slow
// requests it explains (tens of ms and up), long enough that reading a
// dozen small /proc files each time costs little CPU.
const sampleEvery = 5 * time.Millisecond

// schedWait is the total CPU time and run-queue wait of pid's threads so
// far (schedstat's first two fields). Threads that exited are no longer
// counted, so the totals can step down; the sampler's deltas clamp at
// zero.
func schedWait(pid int) (cpu, wait time.Duration, err error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("schedstat of pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			cpu += time.Duration(ns)
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			wait += time.Duration(ns)
		}
	}
	return cpu, wait, nil
}

// minorFaults is pid's minor page-fault count so far (the tenth field of
// /proc/PID/stat, every thread's, live and exited): each is a page the
// kernel mapped on first touch, zeroing it, which costs 1-20 us on a VM.
func minorFaults(pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("stat of pid %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after its closing parenthesis start at field 3.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 8 {
		return 0, fmt.Errorf("stat of pid %d: %d fields after the name", pid, len(f))
	}
	n, err := strconv.ParseInt(f[7], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat of pid %d: minflt: %w", pid, err)
	}
	return n, nil
}

// waitSample is both processes' run-queue wait at one instant, and the
// server's CPU time and minor faults.
type waitSample struct {
	at                        time.Duration // since the run's start
	serverCPU, server, client time.Duration
	serverFaults              int64
}

// waitSampler records waitSamples until its context ends.
type waitSampler struct {
	mu      sync.Mutex
	samples []waitSample
}

// run samples every sampleEvery until ctx ends; it returns the first
// error reading the server's counters (a wrong --server-pid).
func (s *waitSampler) run(ctx context.Context, start time.Time, serverPID int) error {
	self := os.Getpid()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		scpu, sv, err := schedWait(serverPID)
		if err != nil {
			return err
		}
		faults, err := minorFaults(serverPID)
		if err != nil {
			return err
		}
		_, cl, _ := schedWait(self)
		s.mu.Lock()
		s.samples = append(s.samples, waitSample{at: time.Since(start), serverCPU: scpu, server: sv, client: cl, serverFaults: faults})
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// between is how much each process waited for a CPU, and how much CPU the
// server used and how many pages it faulted, from `from` to `to` (since
// the run's start), from the samples around them.
func (s *waitSampler) between(from, to time.Duration) (serverCPU, server, client time.Duration, faults int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := func(t time.Duration) waitSample {
		i := sort.Search(len(s.samples), func(i int) bool { return s.samples[i].at >= t })
		if i == len(s.samples) {
			i--
		}
		return s.samples[i]
	}
	if len(s.samples) == 0 {
		return 0, 0, 0, 0
	}
	a, b := at(from), at(to)
	return max(b.serverCPU-a.serverCPU, 0), max(b.server-a.server, 0), max(b.client-a.client, 0), b.serverFaults - a.serverFaults
}
