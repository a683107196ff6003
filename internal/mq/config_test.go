package mq_test

import (
	"flag"
	"testing"
	"time"

	"github.com/lmcache-go/lmcache/internal/mq"
)

func TestFlags(t *testing.T) {
	cfg := mq.Defaults()
	if cfg.Host != "localhost" || cfg.Port != 5555 || cfg.TransferMode != "auto" || cfg.WireProfile != "auto" ||
		cfg.ChunkSize != 256 || cfg.HashAlgorithm != "blake3" || cfg.WorkerReapTimeout != 120*time.Second ||
		cfg.WorkerRegistrationGrace != time.Hour || cfg.SessionTTL != 10*time.Minute {
		t.Fatalf("defaults %+v", cfg)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f := mq.AddFlags(fs, &cfg)
	err := fs.Parse([]string{"--host", "0.0.0.0", "--port", "6000", "--supported-transfer-mode", "engine_driven",
		"--wire-profile", "gen2m", "--worker-reap-timeout-seconds", "0", "--worker-registration-grace-seconds", "90.5"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(); err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "0.0.0.0" || cfg.Port != 6000 || cfg.TransferMode != "engine_driven" || cfg.WireProfile != "gen2m" ||
		cfg.WorkerReapTimeout != 0 || cfg.WorkerRegistrationGrace != 90500*time.Millisecond {
		t.Fatalf("parsed %+v", cfg)
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	f = mq.AddFlags(fs, &cfg)
	if err := fs.Parse([]string{"--worker-reap-timeout-seconds", "-1"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(); err == nil {
		t.Fatal("negative reap timeout accepted")
	}
}

func TestConfigValidation(t *testing.T) {
	h := start(t, opts{})
	for _, c := range []mq.Config{
		{TransferMode: "gpu"},
		{TransferMode: mq.ModeLMCacheDriven},
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
