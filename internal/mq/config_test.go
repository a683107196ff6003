package mq_test

import (
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mq"
)

func TestDefaults(t *testing.T) {
	cfg := mq.Defaults()
	if cfg.Host != "localhost" || cfg.Port != 5555 || cfg.TransferMode != "auto" || cfg.WireProfile != "auto" ||
		cfg.ChunkSize != 256 || cfg.HashAlgorithm != "blake3" || cfg.WorkerReapTimeout != 120*time.Second ||
		cfg.WorkerRegistrationGrace != time.Hour || cfg.SessionTTL != 10*time.Minute || cfg.MaxControlInFlight != 1024 || cfg.MaxQueued != 4096 {
		t.Fatalf("defaults %+v", cfg)
	}
}

func TestConfigValidation(t *testing.T) {
	h := start(t, opts{})
	for _, c := range []mq.Config{
		{TransferMode: "gpu"},
		{WireProfile: "gen1"},
		{Port: 70000},
		{ChunkSize: -1},
		{HashAlgorithm: "builtin"},
		{Host: "256.0.0.1", Port: 0},
	} {
		if s, err := mq.New(c, h.eng, nil); err == nil {
			_ = s.Run(canceled())
			t.Errorf("New(%+v) succeeded", c)
		}
	}
}
