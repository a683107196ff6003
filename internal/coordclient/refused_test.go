package coordclient_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/lmcache-go/lmcache/internal/coordclient"
	"github.com/lmcache-go/lmcache/internal/coordtest"
	"github.com/lmcache-go/lmcache/internal/kafkaevents"
	"github.com/lmcache-go/lmcache/internal/mpmetrics"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// TestRefusedEventDroppedRestDelivered: the real coordinator answers 422 to
// a request holding one key it refuses (a model_name over its 1024-byte
// bound, which the MP server's keys allow). The request is not resent
// as it is (that would refuse every later flush too): it is split until
// the refused event stands alone, that event is dropped and counted, and
// every other event of the flush, and of a later one, is applied. On both
// event doors.
func TestRefusedEventDroppedRestDelivered(t *testing.T) {
	for _, door := range []string{coordclient.EndpointEvents, coordclient.EndpointQuotaEvents} {
		t.Run(door, func(t *testing.T) {
			base := coordtest.Start(t, listen(t), nil)
			m := mpmetrics.New("mp-r", nil)
			c, err := coordclient.New(coordclient.Config{URL: base, HTTPPort: 8080, InstanceID: "mp-r", EventReporting: true,
				EventEndpoint: door, Metrics: m, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			bad, err := objkey.New([]byte{0xba, 0xd0}, strings.Repeat("m", 1025), 0, 0, "ten")
			if err != nil {
				t.Fatal(err)
			}
			l := c.Listener("fs", false)
			l.OnStored([]objkey.Key{key(t, 1), key(t, 2), bad, key(t, 3)}, []int64{1000, 16, 5, 8})
			l.OnDeleted([]objkey.Key{key(t, 2)})
			if err := c.Flush(context.Background()); err != nil {
				t.Fatalf("flush with one refused event: %v", err)
			}
			if c.Dropped() != 1 || m.CoordEventsDropped.Value() != 1 || c.Pending() != 0 {
				t.Fatalf("dropped %d, metric %v, pending %d; want 1, 1, 0", c.Dropped(), m.CoordEventsDropped.Value(), c.Pending())
			}
			usage := func() float64 {
				var q struct {
					TotalGB float64 `json:"total_gb"`
				}
				getJSON(t, base+"/quota", &q)
				return q.TotalGB * (1 << 30)
			}
			if u := usage(); math.Abs(u-1008) > 0.5 {
				t.Fatalf("usage %v bytes, want 1008 (keys 1 and 3; 2 stored then deleted)", u)
			}
			l.OnStored([]objkey.Key{key(t, 4)}, []int64{2000})
			if err := c.Flush(context.Background()); err != nil {
				t.Fatalf("a later flush: %v", err)
			}
			if u := usage(); math.Abs(u-3008) > 0.5 || c.Dropped() != 1 {
				t.Fatalf("usage %v bytes, dropped %d; want 3008, 1", u, c.Dropped())
			}
		})
	}
}

// TestPublisherRefusedEventCounted: the Kafka sink refuses a whole list
// when one batch fails validation (a key with a negative kv_rank, as a
// storage name another server wrote can carry). The list is split until
// the refused event stands alone; it is dropped and counted, the other
// events reach the brokers.
func TestPublisherRefusedEventCounted(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, kafkaevents.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	sink, err := kafkaevents.NewSink(kafkaevents.SinkConfig{Brokers: cluster.ListenAddrs(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	m := mpmetrics.New("mp-k", nil)
	c, err := coordclient.New(coordclient.Config{URL: "http://127.0.0.1:1", HTTPPort: 8080, InstanceID: "mp-k", EventReporting: true,
		Publisher: sink, Metrics: m, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	neg := objkey.Key{ChunkHash: "\x0b", ModelName: "org/m", KVRank: -1}
	c.Listener("fs", false).OnStored([]objkey.Key{key(t, 1), neg, key(t, 2)}, []int64{10, 20, 30})
	if err := c.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Dropped() != 1 || m.CoordEventsDropped.Value() != 1 || c.Pending() != 0 || sink.DeliveredBatches() != 2 || sink.DroppedBatches() != 0 {
		t.Fatalf("dropped %d, metric %v, pending %d, delivered %d, sink dropped %d; want 1, 1, 0, 2, 0",
			c.Dropped(), m.CoordEventsDropped.Value(), c.Pending(), sink.DeliveredBatches(), sink.DroppedBatches())
	}
}
