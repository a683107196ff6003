// Package buildinfo holds the version and commit of the binary, as
// upstream's lmcache.utils.VERSION and COMMIT_ID. A release build stamps
// both at link time:
//
//	go build -ldflags "-X github.com/lmcache-go/lmcache/internal/buildinfo.Version=0.3.1 \
//	  -X github.com/lmcache-go/lmcache/internal/buildinfo.Commit=ca79ea33" ./cmd/lmcache
//
// An unstamped build falls back to what the Go toolchain recorded in the
// binary (runtime/debug.ReadBuildInfo): the main module's version and the
// VCS revision, so `go build` in a git checkout still says which commit it
// is. Only a build without either (-buildvcs=false outside a module
// version) reports upstream's "NA-NA".
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Version is the package version; empty when neither the link step nor the
// Go build information gave one. It is resolved at package init, so
// readers (httpapi, the coordinator) see the final value.
var Version = ""

// Commit is the git commit id; empty when unknown.
var Commit = ""

// Modified reports that the VCS checkout had uncommitted changes when the
// binary was built (vcs.modified); false for stamped builds.
var Modified = false

func init() {
	if bi, ok := debug.ReadBuildInfo(); ok {
		Version, Commit, Modified = resolve(Version, Commit, bi)
	}
}

// resolve fills the parts the link step left empty from bi. A stamped part
// wins: a release pipeline's -X flags are the operator's statement of what
// the binary is.
func resolve(version, commit string, bi *debug.BuildInfo) (string, string, bool) {
	stamped := version != "" || commit != ""
	if version == "" {
		// "(devel)" is the toolchain's placeholder for "no version known";
		// the leading "v" of a module version is dropped because upstream's
		// versions ("0.3.1") carry none.
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			version = strings.TrimPrefix(v, "v")
		}
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if commit == "" {
				commit = s.Value
			}
		case "vcs.modified":
			modified = !stamped && s.Value == "true"
		}
	}
	return version, commit, modified
}

// Combined is upstream's get_version(): "<version>-<commit>", each part
// "NA" when unknown, so a build with no identity at all reports "NA-NA".
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

// Labels are the labels of a build_info-style gauge (value 1): version,
// revision and modified ("true"/"false"), with "NA" for an unknown part as
// in Combined. The metric registries live elsewhere; this is what they
// export.
func Labels() map[string]string {
	v, c := Version, Commit
	if v == "" {
		v = "NA"
	}
	if c == "" {
		c = "NA"
	}
	m := "false"
	if Modified {
		m = "true"
	}
	return map[string]string{"version": v, "revision": c, "modified": m}
}
