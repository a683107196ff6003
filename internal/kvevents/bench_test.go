package kvevents

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/tokenhash"
)

// BenchmarkStoreOverhead compares what KV events add to one PREPARE_STORE
// of 16 chunks of 256 tokens (bind the tokens, record 16 stored records in
// the log, encode the vLLM batch the publisher sends) with the blake3
// hashing of the same tokens that the store does anyway (the baseline),
// all timed in each iteration: record/hash is the store path's share
// (Bind and Stored), poll+encode/hash what a poller and the publisher
// spend on the same chunks.
func BenchmarkStoreOverhead(b *testing.B) {
	const chunks, size = 16, 256
	toks := make([]uint32, chunks*size)
	for i := range toks {
		toks[i] = uint32(i * 7919 % 150000)
	}
	h, err := tokenhash.New(tokenhash.Blake3, size)
	if err != nil {
		b.Fatal(err)
	}
	hashes := h.ChunkHashesU32(toks)
	tokChunks := make([][]uint32, chunks)
	keys := make([]objkey.Key, chunks)
	for i := range tokChunks {
		tokChunks[i] = toks[i*size : (i+1)*size]
		keys[i] = objkey.Key{ChunkHash: string(hashes[i]), ModelName: "m"}
	}
	lg, _ := NewLog(DefaultLogSize)
	r := NewRecorder(lg, nil, size, nil)
	var hashT, recordT, readT time.Duration
	for b.Loop() {
		t0 := time.Now()
		_ = h.ChunkHashesU32(toks)
		t1 := time.Now()
		r.Bind(nil, hashes, tokChunks)
		r.Stored(MediumCPU, keys)
		t2 := time.Now()
		recs, _, _, _ := lg.ReadAfter(lg.NextSeq()-chunks-1, "m", chunks)
		_ = AppendBatch(make([]byte, 0, SizeHint(recs)), time.Time{}, 0, recs)
		readT += time.Since(t2)
		recordT += t2.Sub(t1)
		hashT += t1.Sub(t0)
	}
	// record is on the store path; poll+encode run on the poller's and the
	// publisher's goroutines.
	b.ReportMetric(float64(recordT)/float64(hashT), "record/hash")
	b.ReportMetric(float64(readT)/float64(hashT), "poll+encode/hash")
}
