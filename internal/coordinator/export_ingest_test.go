package coordinator

// KafkaGroupID is the consumer group this coordinator's Kafka source joins
// (the configured one, or in HA mode its own derived one).
func (s *Server) KafkaGroupID() string { return s.cfg.Ingest.KafkaGroupID }
