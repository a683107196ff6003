package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// promtool runs Debian's promtool (scripts/install-deps.sh test installs
// it); a missing promtool fails the test.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (run scripts/install-deps.sh test): %v", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Dir = "prometheus"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules checks the rules file with promtool and runs its unit
// tests (synthetic series that must fire, and not fire, the alerts).
func TestAlertRules(t *testing.T) {
	out := promtool(t, "check", "rules", "lmcache-alerts.yml")
	if !strings.Contains(out, "SUCCESS: 16 rules found") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	out = promtool(t, "test", "rules", "lmcache-alerts_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
}

// TestAlertRulesBadFileFails proves the promtool check is not a no-op.
func TestAlertRulesBadFileFails(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (run scripts/install-deps.sh test): %v", err)
	}
	raw, err := os.ReadFile("prometheus/lmcache-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yml")
	broken := strings.Replace(string(raw), "lmcache_mp_l1_usage_ratio > 0.98", "lmcache_mp_l1_usage_ratio >> 0.98", 1)
	if err := os.WriteFile(bad, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, "check", "rules", bad).CombinedOutput(); err == nil {
		t.Fatalf("promtool accepted a broken expression:\n%s", out)
	}
}

// TestDockerfile checks the image recipe without a container runtime (none
// is available here): two stages, the builder's Go matches go.mod, the
// runtime is Debian slim with the libzmq package that provides the
// library the binary links, and the builder's go build line, run here with
// the build args, stamps the version the binary reports.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := strings.ReplaceAll(string(raw), "\\\n", " ")
	froms := regexp.MustCompile(`(?m)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?`).FindAllStringSubmatch(df, -1)
	if len(froms) != 2 || froms[0][2] == "" || !strings.HasPrefix(froms[1][1], "debian:") || !strings.HasSuffix(froms[1][1], "-slim") {
		t.Fatalf("stages %q: want a named builder and a debian:*-slim runtime", froms)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if goVer == nil || !strings.HasPrefix(froms[0][1], "golang:"+goVer[1]+"-") {
		t.Errorf("builder %q does not match go.mod's go %v", froms[0][1], goVer)
	}
	if !strings.Contains(df, "COPY --from="+froms[0][2]+" /out/lmcache /usr/local/bin/lmcache") ||
		!regexp.MustCompile(`(?m)^ENTRYPOINT \["/usr/local/bin/lmcache"\]`).MatchString(df) ||
		!regexp.MustCompile(`(?m)^USER 65532`).MatchString(df) {
		t.Errorf("runtime stage does not copy the binary, run it as the entrypoint, as uid 65532")
	}
	runtimeStage := df[strings.LastIndex(df, "\nFROM "):]
	pkgs := regexp.MustCompile(`apt-get install -y --no-install-recommends ([^&]+)`).FindStringSubmatch(runtimeStage)
	if pkgs == nil {
		t.Fatal("runtime stage installs no packages")
	}

	// The builder's go build line, with the build args as shell variables.
	build := regexp.MustCompile(`(?m)^RUN (go build .*)$`).FindStringSubmatch(df)
	if build == nil {
		t.Fatal("no RUN go build line")
	}
	bin := filepath.Join(t.TempDir(), "lmcache")
	line := strings.Replace(build[1], "-o /out/lmcache", "-o "+bin, 1)
	cmd := exec.Command("bash", "-c", line)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "VERSION=9.8.7", "COMMIT=deadbeef")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "9.8.7-deadbeef" {
		t.Errorf("stamped build: version = %q (%v), want 9.8.7-deadbeef", out, err)
	}

	// Every shared library the binary needs beyond glibc comes from a
	// package the runtime stage installs.
	ldd, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd: %v", err)
	}
	libs := regexp.MustCompile(`(?m)^\s*(\S+\.so[.\d]*) => (\S+)`).FindAllStringSubmatch(string(ldd), -1)
	sawZmq := false
	for _, l := range libs {
		// Merged /usr: dpkg may know the file as /usr/lib/... or /lib/...
		var owner []byte
		for _, p := range []string{l[2], "/usr" + l[2], strings.TrimPrefix(l[2], "/usr")} {
			if owner, err = exec.Command("dpkg", "-S", p).Output(); err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("dpkg -S %s: %v", l[2], err)
			continue
		}
		pkg := strings.SplitN(strings.SplitN(string(owner), ":", 2)[0], ",", 2)[0]
		if pkg == "libc6" || pkg == "libgcc-s1" || pkg == "libstdc++6" {
			continue // in debian:*-slim already
		}
		sawZmq = sawZmq || strings.HasPrefix(l[1], "libzmq.so")
		installed := func(p string) bool { return strings.Contains(" "+pkgs[1]+" ", " "+p+" ") }
		if !installed(pkg) && !(pkg != "libzmq5" && installed("libzmq5") && transitive(pkg)) {
			t.Errorf("the binary links %s from %s, which the runtime stage (%s) does not install", l[1], pkg, strings.TrimSpace(pkgs[1]))
		}
	}
	if !sawZmq {
		t.Errorf("ldd shows no libzmq:\n%s", ldd)
	}
}

// libzmqDeps is `apt-cache depends --recurse libzmq5`: the packages
// libzmq5 pulls in on Debian, which the runtime stage gets without naming.
var libzmqDeps = sync.OnceValue(func() string {
	out, _ := exec.Command("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances", "libzmq5").Output()
	return string(out)
})

func transitive(pkg string) bool {
	return regexp.MustCompile(`(?m)^\s*(Depends: )?` + regexp.QuoteMeta(pkg) + `$`).MatchString(libzmqDeps())
}
