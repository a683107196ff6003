package mq

import "time"

// SetCommitWait lets mq_test tests shorten LMDCommitWait (d > 0) and see
// when a LOOKUP or RETRIEVE starts waiting for a pending CUDA commit
// (onWait gets its op). Call it before the server sees traffic.
func SetCommitWait(s *Server, d time.Duration, onWait func(op string)) {
	s.st.lmd.commits.deadline.Store(int64(d))
	s.st.lmd.commits.onWait = onWait
}

// SetCommitDeadline changes the shortened LMDCommitWait while the server
// runs (waits that start afterwards use it).
func SetCommitDeadline(s *Server, d time.Duration) { s.st.lmd.commits.deadline.Store(int64(d)) }
