package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/lmcache-go/lmcache/internal/httproute"
	"github.com/lmcache-go/lmcache/internal/loglevel"
	"github.com/lmcache-go/lmcache/internal/redact"
	"github.com/lmcache-go/lmcache/internal/script"
)

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}

func (s *Server) handleMetricsReset(w http.ResponseWriter, _ *http.Request) error {
	s.metrics.Reset()
	writeText(w, http.StatusOK, "ok")
	return nil
}

func (s *Server) handleLogLevel(w http.ResponseWriter, r *http.Request) error {
	q := httproute.Query(r)
	// As upstream, an empty parameter counts as absent.
	name, level := q.Get("logger_name"), q.Get("level")
	hasName, hasLevel := name != "", level != ""
	switch {
	case hasName && hasLevel:
		l, err := s.levels.Set(name, level)
		if errors.Is(err, loglevel.ErrNameTooLong) {
			return errf(ErrBadRequest, "Logger name too long: %d bytes (at most %d)", len(name), loglevel.MaxNameBytes)
		}
		if errors.Is(err, loglevel.ErrTooManyLoggers) {
			return errf(ErrBadRequest, "Too many loggers: %d are known; set the level of an existing one", loglevel.MaxLoggers)
		}
		if err != nil {
			return errf(ErrBadRequest, "Invalid log level: %s", level)
		}
		s.log.Info("log level changed", "logger_name", name, "level", loglevel.Name(l))
		writeText(w, http.StatusOK, fmt.Sprintf("Set %s level to %s (including all handlers)", name, loglevel.Name(l)))
	case hasName:
		writeText(w, http.StatusOK, fmt.Sprintf("%s: %s", name, loglevel.Name(s.levels.Effective(name))))
	case hasLevel:
		writeText(w, http.StatusOK, "null")
	default:
		var b strings.Builder
		b.WriteString("=== Loggers and Levels ===\n")
		for _, e := range s.levels.List() {
			fmt.Fprintf(&b, "%s: %s\n", e.Name, loglevel.Name(e.Level))
		}
		writeText(w, http.StatusOK, b.String())
	}
	return nil
}

var goroutineHeader = regexp.MustCompile(`^goroutine (\d+) `)

// handleThreads dumps goroutines. Upstream lists Python threads; the Go
// equivalent of a thread name is the pprof label set, so ?name= matches
// label values (case-insensitive substring) over the label-aware profile,
// and ?thread_id= selects one goroutine by id from the full dump.
func (s *Server) handleThreads(w http.ResponseWriter, r *http.Request) error {
	q := httproute.Query(r)
	var out strings.Builder
	if q.Has("thread_id") {
		id := strings.TrimSpace(q.Get("thread_id"))
		if _, err := strconv.ParseUint(id, 10, 64); err != nil {
			return invalid("int_parsing", "Input should be a valid integer", "query", "thread_id")
		}
		var buf bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
		recs := strings.Split(buf.String(), "\n\n")
		var kept []string
		for _, rec := range recs {
			if m := goroutineHeader.FindStringSubmatch(strings.TrimSpace(rec)); m != nil && m[1] == id {
				kept = append(kept, strings.TrimSpace(rec))
			}
		}
		fmt.Fprintf(&out, "%s\n\n=== Thread Summary ===\nTotal threads: %d\nTotal goroutines: %d\n", strings.Join(kept, "\n\n"), len(kept), len(recs))
		writeText(w, http.StatusOK, out.String())
		return nil
	}
	name := strings.ToLower(q.Get("name"))
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	text := buf.String()
	total := pprof.Lookup("goroutine").Count()
	// debug=1 output: a header line, then blank-line separated records of
	// identical stacks ("N @ pcs", optional "# labels: {...}", frames).
	_, body, _ := strings.Cut(text, "\n")
	var kept []string
	matched := 0
	for _, rec := range strings.Split(strings.TrimSpace(body), "\n\n") {
		rec = strings.TrimSpace(rec)
		if rec == "" {
			continue
		}
		if name != "" && !strings.Contains(strings.ToLower(labelsOf(rec)), name) {
			continue
		}
		if n, err := strconv.Atoi(strings.Fields(rec)[0]); err == nil {
			matched += n
		}
		kept = append(kept, rec)
	}
	fmt.Fprintf(&out, "%s\n\n=== Thread Summary ===\nTotal threads: %d\nTotal goroutines: %d\n", strings.Join(kept, "\n\n"), matched, total)
	writeText(w, http.StatusOK, out.String())
	return nil
}

func labelsOf(rec string) string {
	sc := bufio.NewScanner(strings.NewReader(rec))
	for sc.Scan() {
		if l, ok := strings.CutPrefix(sc.Text(), "# labels: "); ok {
			// Match on values only: {"name":"x"} → name=x
			var m map[string]string
			if json.Unmarshal([]byte(l), &m) == nil {
				var parts []string
				for _, v := range m {
					parts = append(parts, v)
				}
				return strings.Join(parts, "\x00")
			}
			return l
		}
	}
	return ""
}

// Redacted replaces secret-looking values in GET /env (and everywhere
// else configuration is shown).
const Redacted = redact.Marker

func (s *Server) handleEnv(w http.ResponseWriter, _ *http.Request) error {
	environ := os.Environ
	if s.opts.Environ != nil {
		environ = s.opts.Environ
	}
	list := environ()
	if !s.opts.EnvShowSecrets {
		list = redact.Env(list)
	}
	env := map[string]string{}
	for _, kv := range list {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	// encoding/json sorts map keys, which is the sorted dump upstream gives.
	b, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return err
	}
	writeText(w, http.StatusOK, string(b))
	return nil
}

// maxScriptBytes caps the uploaded script; maxScriptForm the whole
// multipart form (the script plus room for its part headers and
// boundaries).
const (
	maxScriptBytes = 1 << 20
	maxScriptForm  = maxScriptBytes + 64<<10
)

// scriptBodyErr words a body limit error for /run_script (the limit the
// client can act on is the script's); a timeout stays as it is.
func scriptBodyErr(err error) error {
	if errors.Is(err, httproute.ErrBodyTooLarge) {
		return errf(httproute.ErrBodyTooLarge, "script exceeds %d bytes", maxScriptBytes)
	}
	return err
}

func (s *Server) handleRunScript(w http.ResponseWriter, r *http.Request) error {
	if !s.opts.RunScriptEnabled {
		return errf(ErrNotFound, "Not Found")
	}
	// The form is parsed by net/http (multipart, spilling to disk past
	// its memory bound), so the body is bounded with the toolkit's
	// LimitBody rather than read whole by ReadBody; BodyError maps what
	// the parse hit, and anything else is upstream's 400.
	if err := httproute.LimitBody(w, r, maxScriptForm, s.bodyDeadline(maxScriptForm)); err != nil {
		return scriptBodyErr(err)
	}
	f, hdr, err := r.FormFile("script")
	if err != nil {
		if berr := httproute.BodyError(err); !errors.Is(berr, httproute.ErrBodyRead) {
			return scriptBodyErr(berr)
		}
		return errf(ErrBadRequest, "No script file provided")
	}
	defer f.Close()
	if r.MultipartForm != nil {
		defer r.MultipartForm.RemoveAll()
	}
	src, err := io.ReadAll(io.LimitReader(f, maxScriptBytes+1))
	if err != nil {
		return errf(ErrBadRequest, "No script file provided")
	}
	if len(src) > maxScriptBytes {
		return errf(ErrTooLarge, "script exceeds %d bytes", maxScriptBytes)
	}
	res, err := script.Run(r.Context(), script.Config{
		AllowedImports: s.opts.ScriptAllowedImports,
		App:            s.scriptApp(),
		MaxSteps:       s.opts.ScriptMaxSteps,
		Timeout:        s.opts.ScriptTimeout,
		MaxOutput:      s.opts.ScriptMaxOutput,
		MemoryBytes:    s.opts.ScriptMemoryBytes,
	}, hdr.Filename, string(src))
	// Script output is the operator's data, not the server's: it is
	// logged at DEBUG only, and with the configured secrets scrubbed.
	if res.Printed != "" {
		s.log.Debug("run_script output", "file", hdr.Filename, "printed", s.scrub(res.Printed))
	}
	if err != nil {
		s.scriptFailures.WithLabelValues(scriptFailureReason(err)).Inc()
		msg := s.scrub(err.Error())
		s.log.Debug("run_script failed", "file", hdr.Filename, "err", msg)
		writeText(w, http.StatusInternalServerError, "Error executing script: "+msg)
		return nil
	}
	writeText(w, http.StatusOK, s.scrub(res.Text))
	return nil
}

// scriptFailureReason is the reason label of
// lmcache_mp_run_script_failures_total.
func scriptFailureReason(err error) string {
	switch {
	case errors.Is(err, script.ErrMemoryLimit):
		return "memory_limit"
	case errors.Is(err, script.ErrDeadline):
		return "deadline"
	case errors.Is(err, script.ErrOutputLimit):
		return "output_limit"
	case errors.Is(err, script.ErrCancelled):
		return "cancelled"
	case errors.Is(err, script.ErrBusy):
		return "busy"
	case errors.Is(err, script.ErrImportNotAllowed):
		return "import_not_allowed"
	case errors.Is(err, script.ErrSandbox):
		return "sandbox"
	}
	return "error"
}

// scriptApp is the read-only "app" a script sees: snapshots of version,
// config, adapters, status and periodic loops taken when the request
// arrives (the script runs in a sandbox process; upstream injects the live
// FastAPI app, which is full remote code execution). Everything goes
// through redaction first.
func (s *Server) scriptApp() map[string]any {
	snap := func(get func() (any, error)) script.Func {
		v, err := get()
		if err != nil {
			return script.Func{Err: s.scrub(err.Error())}
		}
		tree, err := redactedTree(v)
		if err != nil {
			return script.Func{Err: err.Error()}
		}
		return script.Func{Value: tree}
	}
	return map[string]any{
		"version": s.opts.Version,
		"commit":  s.opts.Commit,
		"config":  snap(func() (any, error) { return s.opts.Config, nil }),
		"periodic_threads": snap(func() (any, error) {
			return s.loops.All(), nil
		}),
		"adapters": snap(func() (any, error) {
			e, err := s.engine()
			if err != nil {
				return nil, err
			}
			return e.Adapters(), nil
		}),
		"status": snap(func() (any, error) {
			e, err := s.engine()
			if err != nil {
				return nil, err
			}
			return e.Status(), nil
		}),
	}
}
