// Package deploy holds what an operator deploys lmcache-go with, outside
// the binary: a Dockerfile, Kubernetes manifests, a Grafana dashboard and
// Prometheus alert rules. The package has no code; its tests check the
// artifacts against the real binaries (metric names, flags, probes) and
// the rules with promtool.
package deploy
