//go:build race

package ledger

// raceDetector: the race detector maps shadow memory for what Apply
// touches, so its thread fault counts are not the ledger's own.
const raceDetector = true
