package leader_test

import (
	"testing"

	"github.com/lmcache-go/lmcache/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The leader tests run against a real three-member etcd cluster
// (internal/etcdtest: Debian's etcd-server on loopback).

type cluster = etcdtest.Cluster

func startCluster(t *testing.T) *cluster { return etcdtest.Start(t, 3) }

func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	return etcdtest.NewClient(t, endpoints)
}
