package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// fileURL returns {endpoint}/{owner}/{repo}/resolve/{revision}/{path}.
func fileURL(endpoint string, r ref) string {
	segs := strings.Split(r.path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return endpoint + "/" + r.owner + "/" + r.repo + "/resolve/" + url.PathEscape(r.revision) + "/" + strings.Join(segs, "/")
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// etagSHA256 returns the lower-case hex SHA-256 carried by an ETag value, or "" when the value is
// not one (git blob ids of small files are 40 hex digits and CDN ETags are opaque).
func etagSHA256(v string) string {
	v = strings.TrimPrefix(strings.TrimSpace(v), "W/")
	v = strings.ToLower(strings.Trim(v, `"`))
	if sha256RE.MatchString(v) {
		return v
	}
	return ""
}

// linkedHeaders records checksum and size headers seen on redirect responses: Hugging Face puts
// the SHA-256 of an LFS file on the redirect, not on the CDN response that follows it.
type linkedHeaders struct {
	mu     sync.Mutex
	sha256 string
}

func (l *linkedHeaders) note(h http.Header) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sha256 != "" {
		return
	}
	if s := etagSHA256(h.Get("X-Linked-Etag")); s != "" {
		l.sha256 = s
	}
}

func (l *linkedHeaders) get() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sha256
}

// clientFor returns a shallow copy of c whose redirect check also records linked headers.
func clientFor(c *http.Client, l *linkedHeaders) *http.Client {
	cc := *c
	prev := c.CheckRedirect
	cc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.Response != nil {
			l.note(req.Response.Header)
		}
		if prev != nil {
			return prev(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &cc
}

// errRestart asks download to discard the partial file and start over without Range.
var errRestart = errors.New("restart")

// download fetches r into final via final+".partial". The caller holds the lock.
func download(ctx context.Context, o resolved, r ref, final string) error {
	partial := final + ".partial"
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}
	defer f.Close()
	for attempt := 0; ; attempt++ {
		err = fetch(ctx, o, r, f, attempt == 0)
		if !errors.Is(err, errRestart) || attempt > 0 {
			break
		}
		if err = f.Truncate(0); err != nil {
			return fmt.Errorf("hub: %s: %w", r, err)
		}
	}
	if err != nil {
		if errors.Is(err, errRestart) {
			err = fmt.Errorf("hub: %s: server refused the download range twice", r)
		}
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}
	if err := os.Rename(partial, final); err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}
	if d, err := os.Open(filepath.Dir(final)); err == nil {
		_ = d.Sync() // persist the rename where the platform allows it
		d.Close()
	}
	return nil
}

// fetch performs one request, writing into f. With resume set and f non-empty it asks for the
// remaining bytes only. On success f holds the whole verified file.
func fetch(ctx context.Context, o resolved, r ref, f *os.File, resume bool) error {
	have := int64(0)
	if resume {
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("hub: %s: %w", r, err)
		}
		have = fi.Size()
	}
	u := fileURL(o.endpoint, r)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}
	if o.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	req.Header.Set("User-Agent", "parley")
	// Byte ranges are meaningless on a compressed representation.
	req.Header.Set("Accept-Encoding", "identity")
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	var linked linkedHeaders
	resp, err := clientFor(o.client, &linked).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("hub: %s: %w", r, ctx.Err())
		}
		return fmt.Errorf("hub: %s: request %s: %w", r, u, err)
	}
	defer resp.Body.Close()

	start := int64(0)
	total := int64(-1)
	switch resp.StatusCode {
	case http.StatusOK:
		total = resp.ContentLength
	case http.StatusPartialContent:
		s, t, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || s != have || have == 0 {
			return errRestart
		}
		start, total = s, t
	case http.StatusRequestedRangeNotSatisfiable:
		return errRestart
	case http.StatusUnauthorized, http.StatusForbidden:
		if o.token == "" {
			return fmt.Errorf("%w: %s: %s: the repository needs a token; set HF_TOKEN", ErrAuth, r, resp.Status)
		}
		return fmt.Errorf("%w: %s: %s: the token was refused or has no access to this repository", ErrAuth, r, resp.Status)
	case http.StatusNotFound:
		return fmt.Errorf("%w: %s (%s)", ErrNotFound, r, u)
	default:
		return fmt.Errorf("hub: %s: unexpected response %s from %s", r, resp.Status, u)
	}

	want := linked.get()
	if want == "" {
		want = etagSHA256(resp.Header.Get("X-Linked-Etag"))
	}
	if want == "" {
		want = etagSHA256(resp.Header.Get("ETag"))
	}
	var h hash.Hash
	if want != "" {
		h = sha256.New()
	}
	if start > 0 && h != nil {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("hub: %s: %w", r, err)
		}
		if _, err := io.CopyN(h, f, start); err != nil {
			return fmt.Errorf("hub: %s: hashing partial file: %w", r, err)
		}
	}
	if start == 0 {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("hub: %s: %w", r, err)
		}
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return fmt.Errorf("hub: %s: %w", r, err)
	}

	bar := newProgress(o.progress, r.path, start, total)
	var w io.Writer = f
	if h != nil {
		w = io.MultiWriter(f, h)
	}
	n, err := io.CopyBuffer(io.MultiWriter(w, bar), resp.Body, make([]byte, 256<<10))
	bar.finish()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("hub: %s: download interrupted after %d bytes (run again to resume): %w", r, start+n, err)
	}
	got := start + n
	if total >= 0 && got != total {
		return fmt.Errorf("hub: %s: download ended after %d of %d bytes (run again to resume)", r, got, total)
	}
	if h != nil {
		if sum := hex.EncodeToString(h.Sum(nil)); sum != want {
			f.Close()
			os.Remove(f.Name())
			return fmt.Errorf("%w: %s: SHA-256 %s, server announced %s; the partial download was deleted", ErrChecksum, r, sum, want)
		}
	}
	return nil
}

// parseContentRange parses "bytes start-end/total" (total may be "*", returned as -1).
func parseContentRange(v string) (start, total int64, ok bool) {
	v, found := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	s, e, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err1 := strconv.ParseInt(s, 10, 64)
	end, err2 := strconv.ParseInt(e, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t <= end {
			return 0, 0, false
		}
		total = t
	}
	return start, total, true
}
