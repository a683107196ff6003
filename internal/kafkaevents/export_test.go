package kafkaevents

import "time"

// Crash makes s's Run return without committing what it applied, as a
// process that dies would (it still leaves the group, so the next member gets
// the partitions at once instead of after the session timeout).
func Crash(s *Source) { s.crashed.Store(true) }

// SetPollRecords bounds one poll of s.
func SetPollRecords(s *Source, n int) { s.pollRecords = n }

// Partition is the partitioner the Sink uses.
var Partition = librdkafkaPartition

// SetWarnClock drives the clock of s's WARN throttle.
func SetWarnClock(s *Sink, now func() time.Time) { s.warns.SetClock(now) }

// SetMaxBufferedRecords lowers the record cap Publish enforces for s.
func SetMaxBufferedRecords(s *Sink, n int64) { s.maxRecords = n }
