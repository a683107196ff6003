package coordinator

import (
	"log/slog"
	"net/http"
	"strings"

	"github.com/lmcache-go/lmcache/internal/coordinator/registry"
)

func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) error {
	f, err := bodyObject(w, r, smallBodyLimit)
	if err != nil {
		return err
	}
	ip := strings.TrimSpace(f.str("ip", true, ""))
	if _, present := f.m["ip"]; present && ip == "" && len(f.errs) == 0 {
		f.fail("ip", "value_error", "Value error, ip must be non-empty", f.m["ip"], map[string]any{"error": "ip must be non-empty"})
	}
	port := f.intRange("http_port", true, 0, 1, 65535)
	id := strings.TrimSpace(f.str("instance_id", false, ""))
	f.tooLong("instance_id", id, maxInstanceIDBytes)
	md := f.strMap("metadata")
	p2p := strings.TrimSpace(f.str("p2p_advertised_url", false, ""))
	mq := f.intRange("mq_port", false, 0, 0, 65535)
	if err := f.err(); err != nil {
		return err
	}
	requested := id
	id, re, err := s.reg.Register(registry.Instance{InstanceID: id, IP: ip, HTTPPort: int(port), Metadata: md, P2PAdvertisedURL: p2p, MQPort: int(mq)})
	if err != nil {
		// Register returns no id when it refuses: the line names the one
		// asked for ("" when the coordinator was to generate it).
		n := s.reg.Len()
		s.metrics.registrationsRefused.Inc()
		// A line after held-back refusals says how many (suppressed); it
		// names only its own instance.
		s.warns.Log(s.log, slog.LevelWarn, "registry_full", warnInterval, "registration refused: the registry is full",
			"instance_id", requested, "ip", ip, "registered", n)
		return withMsg(err, "registry full: %d instances registered; retry once stale ones are swept", n)
	}
	if re {
		s.log.Info("instance re-registered", "instance_id", id, "ip", ip, "http_port", port)
	} else {
		s.log.Info("instance registered", "instance_id", id, "ip", ip, "http_port", port)
	}
	writeJSON(w, http.StatusOK, RegisterResponse{InstanceID: id, ReRegistered: re})
	return nil
}

func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("instance_id")
	if !s.reg.Heartbeat(id) {
		return withMsg(ErrUnknownHeartbeat, "unknown instance %s; re-register", id)
	}
	writeJSON(w, http.StatusOK, HeartbeatResponse{InstanceID: id})
	return nil
}

func (s *Server) handleDeregister(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("instance_id")
	if s.reg.Deregister(id) {
		s.log.Info("instance deregistered", "instance_id", id, "l1_facts_dropped", s.releaseL1(id))
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleListInstances(w http.ResponseWriter, r *http.Request) error {
	list := s.reg.List()
	beats := s.reg.LastHeartbeats()
	rows := make([]InstanceRow, 0, len(list))
	for _, in := range list {
		gated, legacy := s.gate.Stats(in.InstanceID)
		l1b, l1k := s.l1.usage(in.InstanceID)
		// An instance swept between List and LastHeartbeats reads 0.
		var beat pyFloat
		if t, ok := beats[in.InstanceID]; ok {
			beat = pyFloat(unixSeconds(t))
		}
		rows = append(rows, InstanceRow{in.InstanceID, in.IP, in.HTTPPort, pyFloat(in.RegistrationTime), in.Metadata, in.P2PAdvertisedURL, in.MQPort, gated, legacy, l1b, l1k, beat})
	}
	writeJSON(w, http.StatusOK, InstancesResponse{Instances: rows})
	return nil
}

// handleHealthz keeps upstream's {"status": "healthy"}; with --state-file
// it adds state_file_corrupt, true when the file was unreadable at startup
// and moved aside (the coordinator runs, but on empty quotas and pins).
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) error {
	out := HealthzResponse{Status: "healthy"}
	if s.cfg.StateFile != "" {
		out.StateFileCorrupt = &s.stateCorrupt
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// releaseL1 drops the L1 facts of an instance that left the fleet (see
// l1View.fence), counts them with the fenced ones and returns how many.
func (s *Server) releaseL1(id string) int {
	n := s.l1.fence(id)
	s.metrics.l1FactsFenced.Add(float64(n))
	return n
}
