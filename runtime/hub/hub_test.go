package hub

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	testName = "hf://owner/repo/sub/model-Q4_0.gguf"
	testPath = "/owner/repo/resolve/main/sub/model-Q4_0.gguf"
)

func testData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// fakeHub serves one file at testPath the way the hub's resolve endpoint does.
type fakeHub struct {
	data        []byte
	etag        string // sent quoted as ETag when non-empty
	honourRange bool
	token       string // required as Bearer when non-empty
	// beforeBody runs after the headers are sent; used to stall or cut the response.
	beforeBody func(w http.ResponseWriter, r *http.Request, body []byte) (rest []byte)
	delay      time.Duration

	gets   atomic.Int32
	mu     sync.Mutex
	ranges []string
	auths  []string
}

func (h *fakeHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.gets.Add(1)
	h.mu.Lock()
	h.ranges = append(h.ranges, r.Header.Get("Range"))
	h.auths = append(h.auths, r.Header.Get("Authorization"))
	h.mu.Unlock()
	if h.token != "" && r.Header.Get("Authorization") != "Bearer "+h.token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if r.URL.Path != testPath {
		http.NotFound(w, r)
		return
	}
	if h.delay > 0 {
		time.Sleep(h.delay)
	}
	if h.etag != "" {
		w.Header().Set("ETag", `"`+h.etag+`"`)
	}
	body := h.data
	status := http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" && h.honourRange {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"))
		if err != nil || n >= len(h.data) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(h.data)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(h.data)-1, len(h.data)))
		body = h.data[n:]
		status = http.StatusPartialContent
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if h.beforeBody != nil {
		body = h.beforeBody(w, r, body)
	}
	w.Write(body)
}

func (h *fakeHub) seenRanges() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ranges...)
}

func newHub(t *testing.T, h *fakeHub) (Options, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	return Options{CacheDir: dir, Endpoint: srv.URL, Client: srv.Client()},
		filepath.Join(dir, "hf", "owner", "repo", "main", "sub", "model-Q4_0.gguf")
}

func checkFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, sha %s; want %d bytes, sha %s", path, len(got), sha(got), len(want), sha(want))
	}
	for _, suf := range []string{".partial", ".lock"} {
		if _, err := os.Stat(path + suf); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s%s left behind (err %v)", path, suf, err)
		}
	}
}

func TestFreshDownloadThenCached(t *testing.T) {
	data := testData(2<<20+123, 1)
	h := &fakeHub{data: data, etag: sha(data)}
	o, want := newHub(t, h)
	var bar bytes.Buffer
	o.Progress = &bar
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	if p != want {
		t.Fatalf("path %s, want %s", p, want)
	}
	checkFile(t, p, data)
	out := bar.String()
	if !strings.HasPrefix(out, "\r") || !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 ||
		!strings.Contains(out, "100.0%") || !strings.Contains(out, "2.0 MiB / 2.0 MiB") {
		t.Errorf("progress output %q", out)
	}

	// A completed file is used without touching the network, even with the endpoint gone.
	o.Endpoint = "http://127.0.0.1:1"
	o.Progress = nil
	p2, err := Resolve(context.Background(), testName, o)
	if err != nil || p2 != p {
		t.Fatalf("cached resolve: %q, %v", p2, err)
	}
	if n := h.gets.Load(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestEnvDefaults(t *testing.T) {
	data := testData(1000, 2)
	h := &fakeHub{data: data, token: "secret"}
	srv := httptest.NewServer(h)
	defer srv.Close()
	dir := t.TempDir()
	t.Setenv("PARLEY_CACHE", dir)
	t.Setenv("PARLEY_HF_ENDPOINT", srv.URL+"/")
	t.Setenv("HF_TOKEN", "secret")
	p, err := Resolve(context.Background(), testName, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "hf/owner/repo/main/sub/model-Q4_0.gguf"); p != want {
		t.Fatalf("path %s, want %s", p, want)
	}
	checkFile(t, p, data)
}

func TestRevisionURLAndLayout(t *testing.T) {
	var gotPath string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Path
		w.Write([]byte("x"))
	}))
	defer srv.Close()
	dir := t.TempDir()
	p, err := Resolve(context.Background(), "hf://Org-1/My.Model_2@v1.0/a/b/f.gguf",
		Options{CacheDir: dir, Endpoint: srv.URL, Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if want := "/Org-1/My.Model_2/resolve/v1.0/a/b/f.gguf"; gotPath != want {
		t.Errorf("request path %s, want %s", gotPath, want)
	}
	if want := filepath.Join(dir, "hf/Org-1/My.Model_2/v1.0/a/b/f.gguf"); p != want {
		t.Errorf("path %s, want %s", p, want)
	}
}

func TestResume(t *testing.T) {
	data := testData(3<<20, 3)
	h := &fakeHub{data: data, etag: sha(data), honourRange: true}
	o, final := newHub(t, h)
	const have = 1<<20 + 17
	os.MkdirAll(filepath.Dir(final), 0o755)
	if err := os.WriteFile(final+".partial", data[:have], 0o644); err != nil {
		t.Fatal(err)
	}
	var bar bytes.Buffer
	o.Progress = &bar
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
	if r := h.seenRanges(); len(r) != 1 || r[0] != fmt.Sprintf("bytes=%d-", have) {
		t.Errorf("ranges %q", r)
	}
	if !strings.Contains(bar.String(), "3.0 MiB / 3.0 MiB") {
		t.Errorf("progress %q", bar.String())
	}
}

func TestResumeCorruptPrefix(t *testing.T) {
	// The resumed prefix is part of the checksum: a wrong prefix must not reach the final path.
	data := testData(1<<20, 4)
	h := &fakeHub{data: data, etag: sha(data), honourRange: true}
	o, final := newHub(t, h)
	os.MkdirAll(filepath.Dir(final), 0o755)
	bad := bytes.Clone(data[:1000])
	bad[500] ^= 1
	os.WriteFile(final+".partial", bad, 0o644)
	_, err := Resolve(context.Background(), testName, o)
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("err %v, want ErrChecksum", err)
	}
	for _, p := range []string{final, final + ".partial"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after mismatch", p)
		}
	}
	// The next call starts over and succeeds.
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
}

func TestServerIgnoresRange(t *testing.T) {
	data := testData(1<<20+5, 5)
	h := &fakeHub{data: data, etag: sha(data), honourRange: false}
	o, final := newHub(t, h)
	os.MkdirAll(filepath.Dir(final), 0o755)
	// Garbage longer than the file: a 200 answer must replace it entirely.
	os.WriteFile(final+".partial", testData(2<<20, 99), 0o644)
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
	if r := h.seenRanges(); len(r) != 1 || r[0] == "" {
		t.Errorf("ranges %q, want one ranged request", r)
	}
}

func TestRangeNotSatisfiable(t *testing.T) {
	// A partial as long as the file gets 416; the download restarts from zero.
	data := testData(4096, 6)
	h := &fakeHub{data: data, honourRange: true}
	o, final := newHub(t, h)
	os.MkdirAll(filepath.Dir(final), 0o755)
	os.WriteFile(final+".partial", data, 0o644)
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
	if r := h.seenRanges(); len(r) != 2 || r[0] != "bytes=4096-" || r[1] != "" {
		t.Errorf("ranges %q", r)
	}
}

func TestChecksumMismatch(t *testing.T) {
	data := testData(1<<20, 7)
	h := &fakeHub{data: data, etag: sha([]byte("something else"))}
	o, final := newHub(t, h)
	_, err := Resolve(context.Background(), testName, o)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("err %v, want ErrChecksum", err)
	}
	for _, p := range []string{final, final + ".partial", final + ".lock"} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after mismatch", p)
		}
	}
}

func TestOpaqueETagNotChecked(t *testing.T) {
	// Git blob ids (40 hex) and CDN ETags are not SHA-256 values and must not fail the download.
	data := testData(3000, 8)
	h := &fakeHub{data: data, etag: strings.Repeat("ab", 20)}
	o, _ := newHub(t, h)
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
}

func TestRedirectLinkedEtag(t *testing.T) {
	// The hub answers with a redirect carrying X-Linked-Etag; the CDN's own ETag is opaque.
	data := testData(1<<20, 9)
	for _, tc := range []struct {
		linked string
		ok     bool
	}{{sha(data), true}, {sha(data[1:]), false}} {
		mux := http.NewServeMux()
		mux.HandleFunc(testPath, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Linked-Etag", `"`+tc.linked+`"`)
			w.Header().Set("X-Linked-Size", strconv.Itoa(len(data)))
			http.Redirect(w, r, "/cdn/blob", http.StatusFound)
		})
		mux.HandleFunc("/cdn/blob", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"0123456789abcdef-12"`)
			w.Write(data)
		})
		srv := httptest.NewServer(mux)
		dir := t.TempDir()
		p, err := Resolve(context.Background(), testName, Options{CacheDir: dir, Endpoint: srv.URL, Client: srv.Client()})
		srv.Close()
		if tc.ok {
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, p, data)
		} else if !errors.Is(err, ErrChecksum) {
			t.Fatalf("err %v, want ErrChecksum", err)
		}
	}
}

func TestHTTPErrors(t *testing.T) {
	data := testData(100, 10)
	h := &fakeHub{data: data, token: "tok"}
	o, final := newHub(t, h)

	_, err := Resolve(context.Background(), testName, o)
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("no token: %v", err)
	}
	o.Token = "wrong"
	_, err = Resolve(context.Background(), testName, o)
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("wrong token: %v", err)
	}
	o.Token = "tok"
	_, err = Resolve(context.Background(), "hf://owner/repo/missing.gguf", o)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "missing.gguf") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("final exists after errors")
	}
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
	h.mu.Lock()
	if last := h.auths[len(h.auths)-1]; last != "Bearer tok" {
		t.Errorf("Authorization %q", last)
	}
	h.mu.Unlock()

	// An unreachable endpoint is a clear network error.
	o.CacheDir = t.TempDir()
	o.Endpoint = "http://127.0.0.1:1"
	if _, err := Resolve(context.Background(), testName, o); err == nil || !strings.Contains(err.Error(), "request") {
		t.Errorf("unreachable endpoint: %v", err)
	}
}

func TestTruncatedBodyKeepsPartial(t *testing.T) {
	data := testData(1<<20, 11)
	cut := &fakeHub{data: data, honourRange: true, beforeBody: func(w http.ResponseWriter, r *http.Request, body []byte) []byte {
		w.Write(body[:len(body)/2])
		panic(http.ErrAbortHandler) // drop the connection mid-body
	}}
	o, final := newHub(t, cut)
	_, err := Resolve(context.Background(), testName, o)
	if err == nil || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("err %v", err)
	}
	fi, err := os.Stat(final + ".partial")
	if err != nil || fi.Size() == 0 || fi.Size() >= int64(len(data)) {
		t.Fatalf("partial %v %v", fi, err)
	}
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("final exists after truncated download")
	}
}

func TestBadNames(t *testing.T) {
	for _, name := range []string{
		"owner/repo/f.gguf",
		"hf://",
		"hf://owner/repo",
		"hf://owner/repo/",
		"hf://owner//f.gguf",
		"hf:///repo/f.gguf",
		"hf://owner/repo/../f.gguf",
		"hf://owner/repo/a/./f.gguf",
		"hf://../repo/f.gguf",
		"hf://owner/../f.gguf",
		"hf://owner/repo@../f.gguf",
		"hf://owner/repo@/f.gguf",
		"hf://owner/repo@a..b/f.gguf",
		"hf://owner/repo//f.gguf",
		"hf://owner/repo/a\\..\\f.gguf",
		"hf://owner/repo/f.gguf?x=1",
		"hf://owner/repo/f%2e.gguf",
		"hf://own er/repo/f.gguf",
		"hf://-owner/repo/f.gguf",
		"hf://owner/repo./f.gguf",
		"hf://owner/re--po/f.gguf",
		"hf://owner/repo/f.gguf.partial",
		"hf://owner/repo/f.gguf.lock",
		"hf://owner/repo/\x00.gguf",
		"hf://owner/repo/.hidden/../../x",
		"hf://" + strings.Repeat("a", 97) + "/repo/f.gguf",
	} {
		_, err := Resolve(context.Background(), name, Options{CacheDir: t.TempDir(), Endpoint: "http://127.0.0.1:1"})
		if !errors.Is(err, ErrBadName) {
			t.Errorf("%q: err %v, want ErrBadName", name, err)
		}
		if err := CheckName(name); !errors.Is(err, ErrBadName) {
			t.Errorf("CheckName(%q): %v, want ErrBadName", name, err)
		}
	}
	for _, name := range []string{
		"hf://owner/repo/f.gguf",
		"hf://TheBloke/Llama-2-7B-GGUF/llama-2-7b.Q4_K_M.gguf",
		"hf://o/r@0123456789abcdef0123456789abcdef01234567/dir/x-00001-of-00002.gguf",
	} {
		if _, err := parse(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q): %v", name, err)
		}
	}
	if !IsRemote("hf://a/b/c") || IsRemote("/models/hf://x") || IsRemote("model.gguf") {
		t.Error("IsRemote")
	}
}

func TestConcurrentResolveDownloadsOnce(t *testing.T) {
	data := testData(1<<20, 12)
	h := &fakeHub{data: data, etag: sha(data), delay: 150 * time.Millisecond}
	o, final := newHub(t, h)
	const n = 8
	var wg sync.WaitGroup
	paths := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = Resolve(context.Background(), testName, o)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || paths[i] != final {
			t.Errorf("call %d: %q, %v", i, paths[i], errs[i])
		}
	}
	checkFile(t, final, data)
	if g := h.gets.Load(); g != 1 {
		t.Errorf("%d downloads, want 1", g)
	}
}

func TestCancelLeavesResumablePartial(t *testing.T) {
	data := testData(2<<20, 13)
	release := make(chan struct{})
	h := &fakeHub{data: data, etag: sha(data), honourRange: true}
	h.beforeBody = func(w http.ResponseWriter, r *http.Request, body []byte) []byte {
		if r.Header.Get("Range") != "" {
			return body
		}
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
		panic(http.ErrAbortHandler)
	}
	defer close(release)
	o, final := newHub(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Resolve(ctx, testName, o)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(final + ".partial"); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no partial data written")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	fi, err := os.Stat(final + ".partial")
	if err != nil || fi.Size() == 0 {
		t.Fatalf("partial after cancel: %v %v", fi, err)
	}
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("final exists after cancel")
	}
	p, err := Resolve(context.Background(), testName, o)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, p, data)
	if r := h.seenRanges(); len(r) != 2 || r[1] != fmt.Sprintf("bytes=%d-", fi.Size()) {
		t.Errorf("ranges %q, partial %d", r, fi.Size())
	}
}

func TestCancelWhileWaitingForLock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.lock")
	unlock, err := lockPath(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := lockPath(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
}

func TestLocks(t *testing.T) {
	for name, lock := range map[string]func(context.Context, string) (func(), error){
		"platform": lockPath, "excl": lockExcl,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.lock")
			var inside, maxInside atomic.Int32
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					unlock, err := lock(context.Background(), path)
					if err != nil {
						t.Error(err)
						return
					}
					v := inside.Add(1)
					for {
						m := maxInside.Load()
						if v <= m || maxInside.CompareAndSwap(m, v) {
							break
						}
					}
					time.Sleep(10 * time.Millisecond)
					inside.Add(-1)
					unlock()
				}()
			}
			wg.Wait()
			if m := maxInside.Load(); m != 1 {
				t.Errorf("%d holders at once", m)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("lock file left behind")
			}
		})
	}
}

func TestExclLockStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.lock")
	os.WriteFile(path, []byte("12345\n"), 0o644)
	old := time.Now().Add(-2 * lockStale)
	os.Chtimes(path, old, old)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := lockExcl(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}

func TestParseContentRange(t *testing.T) {
	for _, tc := range []struct {
		in           string
		start, total int64
		ok           bool
	}{
		{"bytes 10-99/100", 10, 100, true},
		{"bytes 0-0/1", 0, 1, true},
		{"bytes 10-99/*", 10, -1, true},
		{"bytes 10-99/99", 0, 0, false},
		{"bytes 10-9/100", 0, 0, false},
		{"bytes */100", 0, 0, false},
		{"items 1-2/3", 0, 0, false},
		{"bytes -1-5/10", 0, 0, false},
		{"", 0, 0, false},
	} {
		s, n, ok := parseContentRange(tc.in)
		if ok != tc.ok || (ok && (s != tc.start || n != tc.total)) {
			t.Errorf("%q: %d %d %v", tc.in, s, n, ok)
		}
	}
	if etagSHA256(`W/"`+strings.Repeat("AB", 32)+`"`) != strings.Repeat("ab", 32) || etagSHA256(`"abc"`) != "" {
		t.Error("etagSHA256")
	}
}
