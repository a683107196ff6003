// Package s3 is the "s3" L2 adapter over aws-sdk-go-v2. Object names are
// upstream's S3 codec (objkey.Key.S3Name) and bodies are the raw object
// bytes, so a bucket can be shared with Python servers in both directions.
//
// Concurrency: every method may be called concurrently. A semaphore of
// s3_num_io_threads slots bounds the requests in flight across all calls;
// per-key requests of one call run on goroutines owned by that call, which
// waits for all of them before returning. Every request passes the circuit
// breaker, so an S3 outage turns into fast ErrUnavailable failures (the
// engine then serves from L1 only) instead of stalled requests. Every call
// passes the bookkeep.Gate, so Close waits for them before dropping idle
// connections.
package s3

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/lmcache-go/lmcache/internal/l2"
	"github.com/lmcache-go/lmcache/internal/l2/bookkeep"
	"github.com/lmcache-go/lmcache/internal/objkey"
)

// deleteBatch is the S3 DeleteObjects limit.
const deleteBatch = 1000

// Adapter is the s3 adapter.
type Adapter struct {
	cfg       Config
	tgt       target
	client    *s3.Client
	transport *http.Transport
	sem       chan struct{}
	brk       *breaker
	// trip is cancelled when the breaker opens, aborting every request in
	// flight: on a stalled S3 they would otherwise each wait their whole
	// timeout, holding up the lookups waiting on them. Replaced at once by
	// a fresh one; guarded by tripMu.
	tripMu     sync.Mutex
	trip       context.Context
	tripCancel context.CancelFunc
	book       *bookkeep.Book
	gate       bookkeep.Gate
}

var _ l2.Adapter = (*Adapter)(nil)

// New builds the client. It sends no request: S3 may be down at start, and
// the breaker handles that like any later outage.
func New(ctx context.Context, cfg Config) (*Adapter, error) {
	d := Defaults()
	if cfg.NumIOThreads <= 0 {
		cfg.NumIOThreads = d.NumIOThreads
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = d.MaxAttempts
	}
	if cfg.BreakerThreshold <= 0 {
		cfg.BreakerThreshold = d.BreakerThreshold
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = d.BreakerCooldown
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = d.OpTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = d.DialTimeout
	}
	if cfg.SlowCall <= 0 {
		cfg.SlowCall = d.SlowCall
	}
	if cfg.AddressingStyle == "" {
		cfg.AddressingStyle = d.AddressingStyle
	}
	tgt, err := cfg.resolve()
	if err != nil {
		return nil, fmt.Errorf("s3: %w", err)
	}
	tr, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	a := &Adapter{
		cfg:       cfg,
		tgt:       tgt,
		transport: tr,
		sem:       make(chan struct{}, cfg.NumIOThreads),
		brk:       newBreaker(cfg.BreakerThreshold, cfg.BreakerCooldown, cfg.Now),
		book:      bookkeep.New(cfg.MaxCapacityBytes),
	}
	a.trip, a.tripCancel = context.WithCancel(context.Background())
	a.brk.onTrip = a.abortInFlight
	a.client, err = newClient(ctx, cfg, tgt, &http.Client{Transport: tr})
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return a, nil
}

func newTransport(cfg Config) (*http.Transport, error) {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     cfg.PreferHTTP2,
		MaxIdleConns:          cfg.NumIOThreads,
		MaxIdleConnsPerHost:   cfg.NumIOThreads,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   cfg.DialTimeout,
		ResponseHeaderTimeout: cfg.OpTimeout,
		ExpectContinueTimeout: time.Second,
		// Large bodies: bigger socket-side buffers cut syscalls per MiB.
		WriteBufferSize: 256 << 10,
		ReadBufferSize:  256 << 10,
	}
	if cfg.CABundle != "" {
		pem, err := os.ReadFile(cfg.CABundle)
		if err != nil {
			return nil, fmt.Errorf("s3: s3_ca_bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("s3: s3_ca_bundle %s holds no PEM certificates", cfg.CABundle)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr, nil
}

func newClient(ctx context.Context, cfg Config, tgt target, hc *http.Client) (*s3.Client, error) {
	opts := func(o *s3.Options) {
		o.Region = cfg.Region
		o.HTTPClient = hc
		o.UsePathStyle = tgt.pathStyle
		if tgt.baseURL != "" {
			o.BaseEndpoint = aws.String(tgt.baseURL)
		} else if cfg.DisableTLS {
			o.EndpointOptions.DisableHTTPS = true
		}
		// Checksums only where S3 requires them (DeleteObjects): the object
		// bytes are content-addressed KV data and some S3-compatible
		// servers reject the SDK's default CRC trailers.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		o.Retryer = retry.NewStandard(func(r *retry.StandardOptions) {
			r.MaxAttempts = cfg.MaxAttempts
			r.MaxBackoff = 2 * time.Second
			// The breaker limits retries during outages; the SDK's token
			// bucket would instead fail requests with "quota exceeded".
			r.RateLimiter = ratelimit.None
		})
		if cfg.AccessKeyID != "" {
			o.Credentials = credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")
		}
	}
	if cfg.AccessKeyID != "" {
		return s3.New(s3.Options{}, opts), nil
	}
	// The default chain: env, shared profile, web identity, container and
	// instance credentials, as boto3 resolves them upstream.
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.Region))
	if err != nil {
		return nil, fmt.Errorf("s3: load default AWS config: %w", err)
	}
	return s3.NewFromConfig(awsCfg, opts), nil
}

// Client is the underlying SDK client (benchmarks, tests).
func (a *Adapter) Client() *s3.Client { return a.client }

// Bucket is the resolved bucket name.
func (a *Adapter) Bucket() string { return a.tgt.bucket }

// TypeName implements l2.Adapter.
func (a *Adapter) TypeName() string { return TypeName }

func (a *Adapter) enter() error { return a.gate.Enter("s3") }

func (a *Adapter) leave() { a.gate.Leave() }

// call runs one S3 request through the semaphore and the breaker. A
// request still running after slowAfter counts as a slow call at that
// moment (a timer owned by this call, stopped before it returns).
func (a *Adapter) call(ctx context.Context, slowAfter time.Duration, fn func(ctx context.Context) error) error {
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-a.sem }()
	probe, err := a.brk.allow()
	if err != nil {
		return err
	}
	a.tripMu.Lock()
	trip := a.trip
	a.tripMu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopTrip := context.AfterFunc(trip, cancel)
	defer stopTrip()
	failSlow := l2.FailSlow(ctx)
	var abandoned atomic.Bool
	t := time.AfterFunc(slowAfter, func() {
		// Count the slow call before cancelling: the cancel lets the
		// caller return, and a caller that then reads the breaker (a
		// lookup answered, a status read) must already see the count.
		a.brk.slow(probe)
		if failSlow {
			abandoned.Store(true)
			cancel()
		}
	})
	err = fn(cctx)
	// Stop reports false when the timer has fired (or is firing): the call
	// was counted as slow, so record leaves its outcome alone; so does a
	// call the breaker's opening aborted (it says nothing new about S3).
	slow := !t.Stop()
	switch {
	case err != nil && !slow && errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller's deadline ended the call before S3 answered and
		// before its slow limit: say so, so that the caller can report
		// the cut (breaker.cut) once for the whole operation.
		err = fmt.Errorf("%w (%w)", errDeadlineCut, err)
	case err == nil || ctx.Err() != nil:
	case abandoned.Load():
		err = fmt.Errorf("s3: %w after %v (%w)", l2.ErrSlow, slowAfter, err)
	case trip.Err() != nil:
		err = fmt.Errorf("%w: aborted when the breaker opened (%w)", l2.ErrUnavailable, err)
		slow = true
	}
	a.brk.record(ctx, probe, err, slow)
	return err
}

// abortInFlight runs when the breaker opens (under the breaker's lock):
// it cancels the requests in flight and arms a fresh trip context for the
// ones admitted later.
func (a *Adapter) abortInFlight() {
	a.tripMu.Lock()
	defer a.tripMu.Unlock()
	a.tripCancel()
	a.trip, a.tripCancel = context.WithCancel(context.Background())
}

// slowLimit is when a request moving n body bytes counts as slow: the
// s3_slow_call_s threshold plus 100 ms per MiB (a 10 MiB/s floor), so a
// large transfer on a healthy link is not mistaken for a stall.
func (a *Adapter) slowLimit(n int) time.Duration {
	return a.cfg.SlowCall + time.Duration(n>>20)*100*time.Millisecond
}

// deleteSlowLimit is when a DeleteObjects of n keys counts as slow: the
// s3_slow_call_s threshold plus 2 ms per key. S3 deletes a batch's objects
// one by one server-side, so a healthy 1000-key batch can take seconds;
// held to the plain limit, three of them opened the breaker and aborted
// every call in flight.
func (a *Adapter) deleteSlowLimit(n int) time.Duration {
	return a.cfg.SlowCall + time.Duration(n)*2*time.Millisecond
}

// transferTimeout bounds one PUT or GET of n bytes: the op timeout plus
// one second per MiB (a 1 MiB/s floor), so a server that stops reading or
// sending mid-body cannot stall a request forever.
func (a *Adapter) transferTimeout(n int) time.Duration {
	return a.cfg.OpTimeout + time.Duration(n>>20)*time.Second
}

// forEach runs fn for every index on its own goroutine (bounded by the
// semaphore inside call) and waits for all of them.
func forEach(n int, fn func(i int)) {
	if n == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	wg.Wait()
}

// Store implements l2.Adapter: one PutObject per key; it fails if any fails.
func (a *Adapter) Store(ctx context.Context, keys []objkey.Key, objs [][]byte) error {
	if len(keys) != len(objs) {
		return fmt.Errorf("s3: store: %d keys but %d objects", len(keys), len(objs))
	}
	if err := a.enter(); err != nil {
		return err
	}
	defer a.leave()
	if len(keys) == 0 {
		return nil
	}
	// No delete of these keys runs between a PUT's answer and its count:
	// one in between removed an object that was then counted.
	if err := a.book.BeginStore(ctx, keys); err != nil {
		return fmt.Errorf("s3: store: %w", err)
	}
	defer a.book.EndStore(keys)
	errs := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		errs[i] = a.call(ctx, a.slowLimit(len(objs[i])), func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, a.transferTimeout(len(objs[i])))
			defer cancel()
			_, err := a.client.PutObject(ctx, &s3.PutObjectInput{
				Bucket:        aws.String(a.tgt.bucket),
				Key:           aws.String(keys[i].S3Name()),
				Body:          bytes.NewReader(objs[i]),
				ContentLength: aws.Int64(int64(len(objs[i]))),
				ContentType:   aws.String("application/octet-stream"),
			})
			return err
		})
	})
	// The PUTs that succeeded are in the bucket whether or not the others
	// failed, so they count and are reported: uncounted, they would hold
	// bucket space outside usage and eviction.
	var landed []objkey.Key
	var sizes []int64
	for i, err := range errs {
		if err == nil {
			landed = append(landed, keys[i])
			sizes = append(sizes, int64(len(objs[i])))
		}
	}
	a.book.Stored(landed, sizes)
	a.book.FireStored(landed, sizes)
	if n, first := countErrs(errs); n > 0 {
		return fmt.Errorf("s3: store: %d of %d objects failed, first: %w", n, len(keys), first)
	}
	return nil
}

func isNotFound(err error) bool {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
		return true
	}
	var nf *types.NotFound
	var nk *types.NoSuchKey
	return errors.As(err, &nf) || errors.As(err, &nk)
}

// LookupAndLock implements l2.Adapter. A key whose size this process
// already knows is a hit without a request (as upstream); others are HEADed,
// and a hit is a 200 with a non-zero length. A failed HEAD is a miss; only
// when every HEAD fails is an error returned (and then nothing is locked).
func (a *Adapter) LookupAndLock(ctx context.Context, keys []objkey.Key) ([]bool, error) {
	hits := make([]bool, len(keys))
	if err := a.enter(); err != nil {
		return hits, err
	}
	defer a.leave()
	if len(keys) == 0 {
		return hits, nil
	}
	// Remembered sizes would answer without S3; while S3 is out they are
	// not trusted (the engine serves from L1 only), as upstream.
	if a.brk.blocked() {
		return hits, fmt.Errorf("s3: lookup: %w", errBroken)
	}
	errs := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		if sz, ok := a.book.Size(keys[i]); ok && sz > 0 {
			hits[i] = true
			return
		}
		errs[i] = a.call(ctx, a.slowLimit(0), func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
			defer cancel()
			out, err := a.client.HeadObject(ctx, &s3.HeadObjectInput{
				Bucket: aws.String(a.tgt.bucket),
				Key:    aws.String(keys[i].S3Name()),
			})
			if err != nil {
				return err
			}
			hits[i] = aws.ToInt64(out.ContentLength) > 0
			return nil
		})
		if isNotFound(errs[i]) {
			errs[i] = nil
		}
	})
	if slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, errDeadlineCut) }) {
		a.brk.cut()
	}
	if failed, firstErr := countErrs(errs); failed == len(keys) {
		return make([]bool, len(keys)), fmt.Errorf("s3: lookup: %w", firstErr)
	}
	a.book.LockHits(keys, hits)
	return hits, nil
}

// countErrs returns how many errs are non-nil and the first of them.
func countErrs(errs []error) (int, error) {
	n := 0
	var first error
	for _, err := range errs {
		if err != nil {
			if n == 0 {
				first = err
			}
			n++
		}
	}
	return n, first
}

// Unlock implements l2.Adapter.
func (a *Adapter) Unlock(keys []objkey.Key) { a.book.Unlock(keys) }

// errSizeMismatch marks an object whose length differs from the buffer.
var errSizeMismatch = errors.New("object size differs from the destination buffer")

// Load implements l2.Adapter: GetObject bodies are read straight into the
// caller's buffers (io.ReadFull, no intermediate copy). An object whose
// length differs from its buffer is not loaded (upstream does not check).
// The error is non-nil only when nothing could be attempted.
func (a *Adapter) Load(ctx context.Context, keys []objkey.Key, dst [][]byte) ([]bool, error) {
	ok := make([]bool, len(keys))
	if len(keys) != len(dst) {
		return ok, fmt.Errorf("s3: load: %d keys but %d buffers", len(keys), len(dst))
	}
	if err := a.enter(); err != nil {
		return ok, err
	}
	defer a.leave()
	if len(keys) == 0 {
		return ok, nil
	}
	errs := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		errs[i] = a.call(ctx, a.slowLimit(len(dst[i])), func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, a.transferTimeout(len(dst[i])))
			defer cancel()
			return a.getInto(ctx, keys[i], dst[i])
		})
		ok[i] = errs[i] == nil
	})
	if err := ctx.Err(); err != nil {
		return ok, fmt.Errorf("s3: load: %w", err)
	}
	for _, err := range errs {
		if err == nil || !errors.Is(err, l2.ErrUnavailable) {
			return ok, nil
		}
	}
	return ok, fmt.Errorf("s3: load: %w", errs[0])
}

func (a *Adapter) getInto(ctx context.Context, k objkey.Key, dst []byte) error {
	out, err := a.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(a.tgt.bucket),
		Key:    aws.String(k.S3Name()),
	})
	if err != nil {
		if isNotFound(err) {
			// A miss is an answer from S3, not a transport failure.
			return &notFound{err}
		}
		return err
	}
	defer out.Body.Close()
	if out.ContentLength != nil && *out.ContentLength != int64(len(dst)) {
		return &notFound{fmt.Errorf("%w: %d != %d", errSizeMismatch, *out.ContentLength, len(dst))}
	}
	if _, err := io.ReadFull(out.Body, dst); err != nil {
		return fmt.Errorf("read body of %s: %w", k.S3Name(), err)
	}
	if out.ContentLength == nil {
		// No length to compare (a chunked answer): the body must end
		// here, or a longer object would be loaded truncated.
		var one [1]byte
		switch _, err := io.ReadFull(out.Body, one[:]); {
		case err == nil:
			return &notFound{fmt.Errorf("%w: longer than %d", errSizeMismatch, len(dst))}
		case !errors.Is(err, io.EOF):
			return fmt.Errorf("read body of %s: %w", k.S3Name(), err)
		}
	}
	return nil
}

// notFound wraps a per-key failure that proves S3 answered.
type notFound struct{ err error }

func (e *notFound) Error() string { return e.err.Error() }
func (e *notFound) Unwrap() error { return e.err }

// Delete implements l2.Adapter with DeleteObjects in batches of at most
// 1000 keys. Locked keys are skipped; keys S3 reports as deleted are
// returned and reported to listeners.
func (a *Adapter) Delete(ctx context.Context, keys []objkey.Key) ([]objkey.Key, error) {
	if err := a.enter(); err != nil {
		return nil, err
	}
	defer a.leave()
	victims := a.book.BeginDelete(keys)
	byName := make(map[string]objkey.Key, len(victims))
	for _, k := range victims {
		byName[k.S3Name()] = k
	}
	var removed []objkey.Key
	var errs []error
	for start := 0; start < len(victims); start += deleteBatch {
		batch := victims[start:min(start+deleteBatch, len(victims))]
		ids := make([]types.ObjectIdentifier, len(batch))
		for i, k := range batch {
			ids[i] = types.ObjectIdentifier{Key: aws.String(k.S3Name())}
		}
		err := a.call(ctx, a.deleteSlowLimit(len(batch)), func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
			defer cancel()
			out, err := a.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
				Bucket: aws.String(a.tgt.bucket),
				Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(false)},
			})
			if err != nil {
				return err
			}
			for _, d := range out.Deleted {
				if k, ok := byName[aws.ToString(d.Key)]; ok {
					removed = append(removed, k)
				}
			}
			for _, e := range out.Errors {
				errs = append(errs, fmt.Errorf("%s: %s %s", aws.ToString(e.Key), aws.ToString(e.Code), aws.ToString(e.Message)))
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	a.book.EndDelete(victims, removed)
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("s3: delete: %w", err)
	}
	return removed, nil
}

// List implements l2.Adapter with ListObjectsV2. The page token is S3's
// continuation token, passed through. Objects whose names do not decode,
// or decode to a key whose name is another (other tools share the
// bucket), are skipped, so a page may hold fewer entries than asked for,
// even none with a non-empty token.
func (a *Adapter) List(ctx context.Context, modelName string, pageSize int, pageToken string) (l2.Page, error) {
	if err := a.enter(); err != nil {
		return l2.Page{}, err
	}
	defer a.leave()
	if pageSize <= 0 || pageSize > 1000 {
		pageSize = 1000
	}
	in := &s3.ListObjectsV2Input{Bucket: aws.String(a.tgt.bucket), MaxKeys: aws.Int32(int32(pageSize))}
	if modelName != "" {
		in.Prefix = aws.String(modelName + "@")
	}
	if pageToken != "" {
		in.ContinuationToken = aws.String(pageToken)
	}
	var page l2.Page
	err := a.call(ctx, a.slowLimit(0), func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
		defer cancel()
		out, err := a.client.ListObjectsV2(ctx, in)
		if err != nil {
			return err
		}
		for _, o := range out.Contents {
			name := aws.ToString(o.Key)
			k, err := objkey.ParseS3Name(name)
			// The parser is lenient (upper-case hex, "0X"): a foreign
			// name that parses to a key whose own name is another is
			// not that key's object, since every call on the key
			// addresses k.S3Name().
			if err != nil || k.S3Name() != name || (modelName != "" && k.ModelName != modelName) {
				continue
			}
			page.Entries = append(page.Entries, l2.Entry{Key: k, SizeBytes: aws.ToInt64(o.Size)})
		}
		if aws.ToBool(out.IsTruncated) {
			page.NextPageToken = aws.ToString(out.NextContinuationToken)
		}
		return nil
	})
	if errors.Is(err, errBroken) {
		return l2.Page{}, fmt.Errorf("%w; listing unavailable", err)
	}
	// S3 answers a continuation token it did not issue with
	// InvalidArgument; that is the client's token, not an adapter fault.
	var ae smithy.APIError
	if pageToken != "" && errors.As(err, &ae) && ae.ErrorCode() == "InvalidArgument" {
		return l2.Page{}, fmt.Errorf("s3: list: %w: %w", l2.ErrBadPageToken, err)
	}
	if err != nil {
		return l2.Page{}, fmt.Errorf("s3: list: %w", err)
	}
	return page, nil
}

// Usage implements l2.Adapter. It counts objects stored by this process
// only (as upstream: S3 usage is not recovered at start).
func (a *Adapter) Usage() l2.Usage { return a.book.Usage() }

// Status implements l2.Adapter with upstream's keys plus breaker details.
func (a *Adapter) Status() map[string]any {
	isClosed := a.gate.Closed()
	state, failures, trips, slows := a.brk.snapshot()
	u := a.book.Usage()
	endpoint := a.tgt.baseURL
	if endpoint == "" {
		endpoint = a.cfg.Endpoint
	}
	return map[string]any{
		"is_healthy":          !isClosed && state == closed,
		"type":                "S3L2Adapter",
		"endpoint":            endpoint,
		"region":              a.cfg.Region,
		"bucket":              a.tgt.bucket,
		"addressing_style":    a.cfg.AddressingStyle,
		"connection_failures": failures,
		"connection_disabled": state != closed,
		l2.StatusBreakerKey:   state.String(),
		"breaker_trips":       trips,
		"slow_calls":          slows,
		"current_size_bytes":  u.TotalBytesUsed,
		"max_capacity_bytes":  a.cfg.MaxCapacityBytes,
	}
}

// AddListener implements l2.Adapter.
func (a *Adapter) AddListener(l l2.Listener) { a.book.AddListener(l) }

// Close waits for in-flight calls and closes idle connections (their
// goroutines belong to the transport). S3 objects always persist.
func (a *Adapter) Close() error {
	return a.gate.Close(func() error {
		a.transport.CloseIdleConnections()
		return nil
	})
}
