package coordinator

// L1Instances is how many instances have an entry in the L1 view.
func (s *Server) L1Instances() int {
	s.l1.mu.Lock()
	defer s.l1.mu.Unlock()
	return len(s.l1.by)
}

// SetRegistryLimits lowers the registry's bounds for a test.
func (s *Server) SetRegistryLimits(instances int, bytes int64) { s.reg.SetLimits(instances, bytes) }
