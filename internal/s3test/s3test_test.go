package s3test_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"

	"github.com/lmcache-go/lmcache/internal/s3test"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func roundTrip(t *testing.T, srv *s3test.Server) {
	ctx := context.Background()
	_, err := srv.Client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("a/b@c"), Body: bytes.NewReader([]byte("hello"))})
	if err != nil {
		t.Fatal(err)
	}
	out, err := srv.Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("a/b@c")})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if string(body) != "hello" {
		t.Fatalf("body %q", body)
	}
	if names := srv.Keys(t, srv.Bucket); len(names) != 1 || names[0] != "a/b@c" {
		t.Fatalf("keys %v", names)
	}
}

func TestVersity(t *testing.T) {
	srv := s3test.Versity(t)
	if srv.Kind != "versitygw" || srv.Dir == "" {
		t.Fatalf("server %+v", srv)
	}
	roundTrip(t, srv)
	// The POSIX backend stores the object under the bucket directory.
	if _, err := os.Stat(srv.Dir + "/" + srv.Bucket + "/a/b@c"); err != nil {
		t.Fatalf("object not on disk: %v", err)
	}
}

func TestFake(t *testing.T) { roundTrip(t, s3test.Fake(t)) }

func TestFindVersityHonoursEnv(t *testing.T) {
	t.Setenv("VERSITYGW", "/nonexistent/versitygw")
	if _, err := s3test.FindVersity(); err == nil {
		t.Fatal("a missing $VERSITYGW path was accepted")
	}
}

// TestVersityFreezeThaw: a frozen versitygw answers nothing (a request with
// a deadline fails), and after Thaw the same server answers again with its
// data intact.
func TestVersityFreezeThaw(t *testing.T) {
	srv := s3test.Versity(t)
	roundTrip(t, srv)
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := srv.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("a/b@c")})
	cancel()
	if err == nil {
		t.Fatal("a frozen versitygw answered HEAD")
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := srv.Client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(srv.Bucket), Key: aws.String("a/b@c")})
	if err != nil || aws.ToInt64(out.ContentLength) != 5 {
		t.Fatalf("HEAD after thaw: %v", err)
	}
	if err := s3test.Fake(t).Freeze(); err == nil {
		t.Fatal("Freeze of an in-process server succeeded")
	}
}
