package coordinator

import (
	"time"

	"github.com/lmcache-go/lmcache/internal/coordinator/ledger"
)

// HoldEvictionCycles blocks every eviction cycle (the loop's and
// RunEvictionCycle's) until release is called, wedging the eviction loop
// for tests of /periodic-threads-health.
func (s *Server) HoldEvictionCycles() (release func()) {
	s.cycleMu.Lock()
	return s.cycleMu.Unlock
}

// SetMaxSeqTracked lowers the seq tracker's bound for a test and returns a
// function restoring it.
func SetMaxSeqTracked(n int) (restore func()) {
	old := maxSeqTracked
	maxSeqTracked = n
	return func() { maxSeqTracked = old }
}

// SetMaxResyncEntries lowers the startup resync's entry bound for a test
// and returns a function restoring it.
func SetMaxResyncEntries(n int) (restore func()) {
	old := maxResyncEntries
	maxResyncEntries = n
	return func() { maxResyncEntries = old }
}

// SetWarnClock replaces the clock of the throttled WARN lines (registry
// full, event-gate reset) for a test.
func (s *Server) SetWarnClock(now func() time.Time) {
	s.warns.SetClock(now)
}

// LedgerReserve reports the ledger's reserve counters.
func (s *Server) LedgerReserve() ledger.ReserveStats { return s.ledger.Reserve() }

// LedgerIngesting is the number of ingest requests the ledger counts in
// flight.
func (s *Server) LedgerIngesting() int { return s.ledger.Ingesting() }

// SetSharedGroupCycles lowers the lag cycles before the shared-group
// warning for a test and returns a function restoring it.
func SetSharedGroupCycles(n int64) (restore func()) {
	old := sharedGroupCycles.Swap(n)
	return func() { sharedGroupCycles.Store(old) }
}

// MaxInstanceIDBytes is the instance_id bound the validators enforce.
const MaxInstanceIDBytes = maxInstanceIDBytes
