package config

// Tracing is OTLP span export of the coordinator's HTTP routes, the same
// three settings as `lmcache server`'s observability group. Upstream's
// coordinator has --otlp-endpoint (LMCACHE_MP_COORDINATOR_OTLP_ENDPOINT)
// for OTLP metrics push; here it is where spans go, and metrics stay on
// GET /metrics.
type Tracing struct {
	// Enabled exports a span per HTTP request; it needs Endpoint.
	Enabled bool
	// Endpoint is the OTLP/gRPC collector: http://host:4317 or host:port
	// (plaintext), https://host:port (TLS).
	Endpoint string
	// Level is storage or events; the coordinator has no storage-level
	// spans, so both export the request spans only.
	Level string
}

// DefaultTracing is tracing off at level storage, as the server.
func DefaultTracing() Tracing { return Tracing{Level: "storage"} }

func tracingFields() []field {
	return []field{
		{flag: "enable-tracing", env: "ENABLE_TRACING", kind: "switch", usage: "export an OpenTelemetry span per HTTP request over OTLP/gRPC to --otlp-endpoint (required with it)",
			b: func(c *Config) *bool { return &c.Tracing.Enabled },
			check: func(c Config) string {
				if c.Tracing.Enabled && c.Tracing.Endpoint == "" {
					return "requires --otlp-endpoint (an OTLP gRPC endpoint such as http://localhost:4317)"
				}
				return ""
			}},
		{flag: "otlp-endpoint", env: "OTLP_ENDPOINT", kind: "string", usage: "OTLP gRPC endpoint for --enable-tracing spans: http://host:4317 or host:port (plaintext), https://host:port (TLS); metrics stay on GET /metrics",
			s: func(c *Config) *string { return &c.Tracing.Endpoint }},
		{flag: "trace-level", env: "TRACE_LEVEL", kind: "string", usage: "span depth with --enable-tracing: storage or events (the coordinator's spans are its HTTP routes at either level)",
			s: func(c *Config) *string { return &c.Tracing.Level },
			check: func(c Config) string {
				if c.Tracing.Level != "storage" && c.Tracing.Level != "events" {
					return "must be storage or events"
				}
				return ""
			}},
	}
}
