// Package mpclient is the coordinator's HTTP client for the MP server
// endpoints it calls: DELETE /cache/objects (eviction dispatch), GET
// /cache/objects (startup resync) and the warm-prefetch submit and poll.
package mpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/lmcache-go/lmcache/internal/objkey"
)

// MaxDeleteBatch is the MP server's per-request key cap for DELETE
// /cache/objects.
const MaxDeleteBatch = 10000

// maxReply bounds how much of an MP reply is read.
const maxReply = 64 << 20

// maxErrorText bounds the server text an error carries: errors reach WARN
// lines and 502 bodies, and a server (or a proxy in front of it) may answer
// an error page of any size up to maxReply.
const maxErrorText = 4 << 10

// ErrReplyTooLarge is a reply longer than maxReply. It is refused whole:
// its first maxReply bytes are not the reply (a delete's "ok": false may lie
// past them, a relayed status body would be cut).
var ErrReplyTooLarge = errors.New("reply too large")

// ErrStatus wraps a non-2xx reply.
var ErrStatus = errors.New("unexpected status")

// ErrNotOK is a 2xx DELETE /cache/objects reply whose body says
// "ok": false (the server reached the adapter but the delete failed; the
// MP API reports that in the body, not the status).
var ErrNotOK = errors.New("server answered ok=false")

// Client talks to MP servers. It is safe for concurrent use; set Token
// before the first request.
type Client struct {
	HTTP *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>" (the MP
	// servers' --http-auth-token). It never appears in an error.
	Token string
}

// New returns a client whose requests time out after timeout (upstream: 30 s).
func New(timeout time.Duration) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	return &Client{HTTP: &http.Client{Timeout: timeout, Transport: tr}}
}

// Close drops idle keep-alive connections (their reader goroutines end).
func (c *Client) Close() { c.HTTP.CloseIdleConnections() }

// BaseURL is the server's HTTP API root.
func BaseURL(ip string, port int) string {
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(port))
}

// StatusError carries a non-2xx reply.
type StatusError struct {
	Code int
	// Body is the reply's first maxErrorText bytes (and its length when
	// it was longer).
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("server answered %d: %s", e.Code, e.Body)
}

func (e *StatusError) Unwrap() error { return ErrStatus }

// errorText is b for an error message: at most maxErrorText bytes of it
// (cut at a UTF-8 character's start), with the full length said when it
// was cut.
func errorText(b []byte) string {
	if len(b) <= maxErrorText {
		return string(b)
	}
	n := maxErrorText
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return fmt.Sprintf("%s… (%d bytes)", b[:n], len(b))
}

func (c *Client) do(ctx context.Context, method, u string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	// One byte past the bound tells a reply of exactly maxReply bytes from
	// a longer one.
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if len(b) > maxReply {
		return resp.StatusCode, nil, fmt.Errorf("%w: %s %s answered %d with more than %d bytes", ErrReplyTooLarge, method, req.URL.Path, resp.StatusCode, maxReply)
	}
	return resp.StatusCode, b, nil
}

// DeleteRequest is the body of DELETE /cache/objects as the coordinator
// sends it: keys only, so the server's defaults (tier l2, primary adapter,
// force false) apply.
type DeleteRequest struct {
	Keys []objkey.Encoded `json:"keys"`
}

// DeleteObjects sends one DELETE /cache/objects.
func (c *Client) DeleteObjects(ctx context.Context, base string, keys []objkey.Encoded) error {
	code, b, err := c.do(ctx, http.MethodDelete, base+"/cache/objects", DeleteRequest{Keys: keys})
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return &StatusError{Code: code, Body: errorText(b)}
	}
	// Only an explicit false fails: older servers answer without "ok".
	var reply struct {
		OK    *bool           `json:"ok"`
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &reply) == nil && reply.OK != nil && !*reply.OK {
		return fmt.Errorf("%w: %s", ErrNotOK, errorText(reply.Error))
	}
	return nil
}

// Page is one GET /cache/objects page; entries are kept raw so one
// malformed entry can be skipped without losing the page.
type Page struct {
	Entries       []json.RawMessage `json:"entries"`
	NextPageToken *string           `json:"next_page_token"`
}

// ListObjects fetches one page of GET /cache/objects.
func (c *Client) ListObjects(ctx context.Context, base string, pageSize int, token *string) (*Page, error) {
	q := url.Values{}
	q.Set("page_size", strconv.Itoa(pageSize))
	if token != nil {
		q.Set("page_token", *token)
	}
	code, b, err := c.do(ctx, http.MethodGet, base+"/cache/objects?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	if code/100 != 2 {
		return nil, &StatusError{Code: code, Body: errorText(b)}
	}
	var p Page
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("decode page: %w", err)
	}
	return &p, nil
}

// PrefetchRequest is the body forwarded to the MP's POST /cache/prefetches.
type PrefetchRequest struct {
	ModelName string  `json:"model_name"`
	WorldSize int     `json:"world_size"`
	TokenIDs  []int64 `json:"token_ids"`
	CacheSalt string  `json:"cache_salt"`
}

// PrefetchReply is the MP's submit reply.
type PrefetchReply struct {
	RequestID *string `json:"request_id"`
	Chunks    *int    `json:"chunks"`
	Status    *string `json:"status"`
}

// SubmitPrefetch relays a warm prefetch; any transport error, non-2xx or
// undecodable reply is an error.
func (c *Client) SubmitPrefetch(ctx context.Context, base string, req PrefetchRequest) (PrefetchReply, error) {
	code, b, err := c.do(ctx, http.MethodPost, base+"/cache/prefetches", req)
	if err != nil {
		return PrefetchReply{}, err
	}
	if code/100 != 2 {
		return PrefetchReply{}, &StatusError{Code: code, Body: errorText(b)}
	}
	var r PrefetchReply
	if err := json.Unmarshal(b, &r); err != nil {
		return PrefetchReply{}, fmt.Errorf("decode reply: %w", err)
	}
	return r, nil
}

// PrefetchStatus polls GET /cache/prefetches/{request_id} and returns the
// status code and body verbatim; err is only for transport failures and a
// reply longer than the read bound (ErrReplyTooLarge).
func (c *Client) PrefetchStatus(ctx context.Context, base, requestID string) (int, []byte, error) {
	return c.do(ctx, http.MethodGet, base+"/cache/prefetches/"+url.PathEscape(requestID), nil)
}
