package coordinator

// IntentMirrorNames is how many quota, default and pin names the HA intent
// mirror keeps a revision for (0 without HA).
func (s *Server) IntentMirrorNames() int {
	if s.ha == nil {
		return 0
	}
	s.ha.mirror.mu.Lock()
	defer s.ha.mirror.mu.Unlock()
	return len(s.ha.mirror.revs)
}
