package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lmcache-go/lmcache/internal/l2/l2test"
	"github.com/lmcache-go/lmcache/internal/l2/s3"
	"github.com/lmcache-go/lmcache/internal/objkey"
	"github.com/lmcache-go/lmcache/internal/s3test"
)

// BenchmarkS3 compares the adapter's Store/Load of one object with bare
// aws-sdk-go-v2 PutObject/GetObject (io.ReadFull into a preallocated
// buffer) on the same versitygw. Every iteration runs both, alternating
// which goes first, so machine noise and drift hit both equally; the
// benchmark reports the median adapter_MB/s and bare_MB/s and their ratio
// (goal >= 0.9).
// See BENCHMARKS.md (S3 adapter).
func BenchmarkS3(b *testing.B) {
	srv := s3test.Versity(b)
	ctx := context.Background()
	a := newAdapter(b, configFor(srv, srv.Bucket))
	b.Cleanup(func() { _ = a.Close() })
	bare := s3test.NewClient(srv.Endpoint, srv.AccessKey, srv.SecretKey)
	for _, mib := range []int{2, 32} {
		size := mib << 20
		obj := make([]byte, size)
		_, _ = rand.Read(obj)
		dst := make([]byte, size)
		getKey := l2test.Keys(b, 1, "")[0]
		if err := a.Store(ctx, []objkey.Key{getKey}, [][]byte{obj}); err != nil {
			b.Fatal(err)
		}
		n := 0
		fresh := func() objkey.Key {
			n++
			k := getKey
			k.ObjectGroupID = int64(n) // a new object name per put
			return k
		}
		put := pair{
			adapter: func() error { return a.Store(ctx, []objkey.Key{fresh()}, [][]byte{obj}) },
			bare: func() error {
				_, err := bare.PutObject(ctx, &awss3.PutObjectInput{
					Bucket: aws.String(srv.Bucket), Key: aws.String(fresh().S3Name()),
					Body: bytes.NewReader(obj), ContentLength: aws.Int64(int64(size)),
					ContentType: aws.String("application/octet-stream"),
				})
				return err
			},
		}
		get := pair{
			adapter: func() error {
				ok, err := a.Load(ctx, []objkey.Key{getKey}, [][]byte{dst})
				if err == nil && !ok[0] {
					err = fmt.Errorf("not loaded")
				}
				return err
			},
			bare: func() error {
				out, err := bare.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String(getKey.S3Name())})
				if err != nil {
					return err
				}
				defer out.Body.Close()
				_, err = io.ReadFull(out.Body, dst)
				return err
			},
		}
		b.Run(fmt.Sprintf("put/%dMiB", mib), func(b *testing.B) { put.run(b, size) })
		b.Run(fmt.Sprintf("get/%dMiB", mib), func(b *testing.B) {
			get.run(b, size)
			if !bytes.Equal(dst, obj) {
				b.Fatal("loaded bytes differ")
			}
		})
	}
	_ = s3.TypeName
}

type pair struct{ adapter, bare func() error }

func (p pair) run(b *testing.B, size int) {
	// One warm-up each so connection setup is outside the measurement.
	if err := p.adapter(); err != nil {
		b.Fatal(err)
	}
	if err := p.bare(); err != nil {
		b.Fatal(err)
	}
	var ta, tb []time.Duration
	timed := func(f func() error, acc *[]time.Duration) {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		*acc = append(*acc, time.Since(start))
	}
	b.SetBytes(int64(2 * size)) // each iteration moves the object twice
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			timed(p.adapter, &ta)
			timed(p.bare, &tb)
		} else {
			timed(p.bare, &tb)
			timed(p.adapter, &ta)
		}
		i++
	}
	// Medians: on a shared machine one preempted request would otherwise
	// dominate a sum.
	mbps := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(size) / ds[len(ds)/2].Seconds() / 1e6
	}
	ra, rb := mbps(ta), mbps(tb)
	b.ReportMetric(ra, "adapter_MB/s")
	b.ReportMetric(rb, "bare_MB/s")
	b.ReportMetric(ra/rb, "ratio")
}
