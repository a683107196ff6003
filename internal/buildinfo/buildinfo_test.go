package buildinfo

import (
	"runtime/debug"
	"testing"
)

func info(version string, settings ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/lmcache-go/lmcache", Version: version}}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

const rev = "ee03e59c0ffee0000000000000000000000000ab"

func TestResolve(t *testing.T) {
	cases := []struct {
		name            string
		version, commit string
		bi              *debug.BuildInfo
		wantV, wantC    string
		wantModified    bool
	}{
		{"vcs checkout", "", "", info("v0.0.0-20261201200359-ee03e59c0ffe+dirty", "vcs", "git", "vcs.revision", rev, "vcs.modified", "true"),
			"0.0.0-20261201200359-ee03e59c0ffe+dirty", rev, true},
		{"clean checkout", "", "", info("v1.2.3", "vcs.revision", rev, "vcs.modified", "false"), "1.2.3", rev, false},
		{"no vcs", "", "", info("(devel)"), "", "", false},
		{"stamped wins", "0.3.1", "ca79ea33", info("v9.9.9", "vcs.revision", rev, "vcs.modified", "true"), "0.3.1", "ca79ea33", false},
		{"stamped version only", "0.3.1", "", info("(devel)", "vcs.revision", rev, "vcs.modified", "true"), "0.3.1", rev, false},
	}
	for _, c := range cases {
		v, cm, m := resolve(c.version, c.commit, c.bi)
		if v != c.wantV || cm != c.wantC || m != c.wantModified {
			t.Errorf("%s: resolve = %q %q %v, want %q %q %v", c.name, v, cm, m, c.wantV, c.wantC, c.wantModified)
		}
	}
}

func TestCombinedAndLabels(t *testing.T) {
	oldV, oldC, oldM := Version, Commit, Modified
	t.Cleanup(func() { Version, Commit, Modified = oldV, oldC, oldM })
	Version, Commit, Modified = "", "", false
	if got := Combined(); got != "NA-NA" {
		t.Fatalf("Combined() = %q, want NA-NA", got)
	}
	if l := Labels(); l["version"] != "NA" || l["revision"] != "NA" || l["modified"] != "false" || len(l) != 3 {
		t.Fatalf("Labels() = %v", l)
	}
	Version, Commit, Modified = "0.0.0-x+dirty", rev, true
	if got := Combined(); got != "0.0.0-x+dirty-"+rev {
		t.Fatalf("Combined() = %q", got)
	}
	if l := Labels(); l["version"] != "0.0.0-x+dirty" || l["revision"] != rev || l["modified"] != "true" {
		t.Fatalf("Labels() = %v", l)
	}
}
