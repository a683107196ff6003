//go:build goexperiment.jsonv2

package coordinator

import (
	jsonv2 "encoding/json/v2"
	"testing"
)

// BenchmarkDecodeBatchJSONv2 measures encoding/json/v2, which needs
// GOEXPERIMENT=jsonv2 in Go 1.26 (so the shipped binary cannot use it):
//
//	GOEXPERIMENT=jsonv2 go test -run x -bench DecodeBatch ./internal/coordinator/
func BenchmarkDecodeBatchJSONv2(b *testing.B) {
	body := eventBatches(1)[0]
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		var w stdBatch
		if err := jsonv2.Unmarshal(body, &w); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}
