// Package buildinfo holds the version and commit stamped into the binary at
// link time, as upstream's lmcache.utils.VERSION and COMMIT_ID.
//
//	go build -ldflags "-X github.com/lmcache-go/lmcache/internal/buildinfo.Version=0.3.1 \
//	  -X github.com/lmcache-go/lmcache/internal/buildinfo.Commit=ca79ea33" ./cmd/lmcache
package buildinfo

// Version is the package version; empty when the build did not stamp it.
var Version = ""

// Commit is the git commit id; empty when the build did not stamp it.
var Commit = ""

// Combined is upstream's get_version(): "<version>-<commit>", each part
// "NA" when unknown, so an unstamped build reports "NA-NA".
func Combined() string {
	v, c := Version, Commit
	if v == "" {
		v = "NA"
	}
	if c == "" {
		c = "NA"
	}
	return v + "-" + c
}
