package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// repoHub serves a repository of several files the way the hub does: the recursive file list
// at /api/models/{owner}/{repo}/tree/{revision} (in pages of pageSize entries, linked by
// rel="next", when pageSize > 0) and each file at /{owner}/{repo}/resolve/{revision}/{path}.
type repoHub struct {
	files    map[string][]byte
	pageSize int

	mu   sync.Mutex
	gets []string
}

func (h *repoHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.gets = append(h.gets, r.URL.Path)
	h.mu.Unlock()
	if tree, ok := strings.CutPrefix(r.URL.Path, "/api/models/owner/repo/tree/"); ok {
		if tree != "main" || r.URL.Query().Get("recursive") != "true" {
			http.NotFound(w, r)
			return
		}
		var paths []string
		for p := range h.files {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		start := 0
		fmt.Sscan(r.URL.Query().Get("cursor"), &start)
		end := len(paths)
		if h.pageSize > 0 && start+h.pageSize < end {
			end = start + h.pageSize
			w.Header().Set("Link", fmt.Sprintf(`<%s?recursive=true&cursor=%d>; rel="next"`, r.URL.Path, end))
		}
		type entry struct {
			Type string `json:"type"`
			Path string `json:"path"`
			Size int    `json:"size"`
		}
		out := []entry{{Type: "directory", Path: "sub"}}
		for _, p := range paths[start:end] {
			out = append(out, entry{"file", p, len(h.files[p])})
		}
		json.NewEncoder(w).Encode(out)
		return
	}
	p, ok := strings.CutPrefix(r.URL.Path, "/owner/repo/resolve/main/")
	data, found := h.files[p]
	if !ok || !found {
		http.NotFound(w, r)
		return
	}
	w.Write(data)
}

func (h *repoHub) requested() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.gets...)
}

func newRepoHub(t *testing.T, h *repoHub) Options {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return Options{CacheDir: t.TempDir(), Endpoint: srv.URL, Client: srv.Client()}
}

func repoFiles(names ...string) map[string][]byte {
	m := map[string][]byte{}
	for i, n := range names {
		m[n] = testData(1000+i, uint64(i+10))
	}
	return m
}

func TestQuantPick(t *testing.T) {
	files := repoFiles(
		"README.md",
		"model-Q4_K_M.gguf",
		"model-Q4_K_S.gguf",
		"model.Q8_0.gguf",
		"model-IQ4_XS.gguf",
		"mmproj-model-Q8_0.gguf",
		"BF16/model-BF16-00001-of-00002.gguf",
		"BF16/model-BF16-00002-of-00002.gguf",
	)
	for _, c := range []struct{ tag, want string }{
		{"Q4_K_M", "model-Q4_K_M.gguf"},
		{"q4_k_m", "model-Q4_K_M.gguf"},
		{"Q8_0", "model.Q8_0.gguf"}, // the projector is not a model
		{"iq4_xs", "model-IQ4_XS.gguf"},
		{"bf16", "BF16/model-BF16-00001-of-00002.gguf"},
	} {
		t.Run(c.tag, func(t *testing.T) {
			h := &repoHub{files: files, pageSize: 3}
			o := newRepoHub(t, h)
			p, err := Resolve(context.Background(), "hf://owner/repo:"+c.tag, o)
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(o.CacheDir, "hf/owner/repo/main", c.want); p != want {
				t.Fatalf("path %s, want %s", p, want)
			}
			checkFile(t, p, files[c.want])
			if shards := splitShards(c.want); shards != nil {
				for _, s := range shards {
					checkFile(t, filepath.Join(o.CacheDir, "hf/owner/repo/main", s), files[s])
				}
			}
			// Only the model's files are downloaded.
			var got []string
			for _, g := range h.requested() {
				if f, ok := strings.CutPrefix(g, "/owner/repo/resolve/main/"); ok {
					got = append(got, f)
				}
			}
			want := splitShards(c.want)
			if want == nil {
				want = []string{c.want}
			}
			if !slices.Equal(got, want) {
				t.Errorf("downloaded %q, want %q", got, want)
			}
		})
	}
}

func TestQuantErrors(t *testing.T) {
	files := repoFiles("a-Q4_K_M.gguf", "b-Q4_K_M.gguf", "a-Q8_0.gguf", "notes.txt",
		"split-Q2_K-00001-of-00003.gguf", "split-Q2_K-00003-of-00003.gguf")
	o := newRepoHub(t, &repoHub{files: files})
	for _, c := range []struct {
		name string
		is   error
		says []string
	}{
		{"hf://owner/repo:Q4_K_M", ErrAmbiguous, []string{`2 models in the repository match "Q4_K_M"`, "a-Q4_K_M.gguf, b-Q4_K_M.gguf", "hf://owner/repo/FILE"}},
		{"hf://owner/repo:Q5_K_M", ErrNotFound, []string{`no GGUF file in the repository matches "Q5_K_M"`, "a-Q4_K_M.gguf, a-Q8_0.gguf, b-Q4_K_M.gguf, split-Q2_K.gguf (2 files)"}},
		{"hf://owner/repo:Q4_K", ErrNotFound, []string{`matches "Q4_K"`}},
		{"hf://owner/repo:Q2_K", ErrNotFound, []string{"the split model split-Q2_K.gguf lacks files"}},
		{"hf://owner/other:Q8_0", ErrNotFound, []string{"no such repository or revision"}},
	} {
		_, err := Resolve(context.Background(), c.name, o)
		if !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want %v", c.name, err, c.is)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", c.name, err, s)
			}
		}
	}
	for _, bad := range []string{"hf://owner/repo:", "hf://owner/repo:Q4/x", "hf://owner/repo:-Q4", "hf://owner/repo:Q4 K"} {
		if err := CheckName(bad); !errors.Is(err, ErrBadName) {
			t.Errorf("CheckName(%q): %v, want ErrBadName", bad, err)
		}
	}
	for _, good := range []string{"hf://owner/repo:Q4_K_M", "hf://owner/repo@v1:ud-q4_k_xl"} {
		if err := CheckName(good); err != nil {
			t.Errorf("CheckName(%q): %v", good, err)
		}
	}
}

// TestQuantOffline: with the hub out of reach, a tag is picked among the files already in the
// cache.
func TestQuantOffline(t *testing.T) {
	files := repoFiles("m-Q4_0.gguf", "m-Q8_0.gguf")
	o := newRepoHub(t, &repoHub{files: files})
	p, err := Resolve(context.Background(), "hf://owner/repo:Q8_0", o)
	if err != nil {
		t.Fatal(err)
	}
	o.Endpoint = "http://127.0.0.1:1"
	p2, err := Resolve(context.Background(), "hf://owner/repo:q8_0", o)
	if err != nil || p2 != p {
		t.Fatalf("offline: %q, %v; want %q", p2, err, p)
	}
	if _, err := Resolve(context.Background(), "hf://owner/repo:Q4_0", o); err == nil || !strings.Contains(err.Error(), "the cache") {
		t.Errorf("offline, not cached: %v", err)
	}
}

// TestSplitByName: naming any file of a split model downloads all of them and resolves to the
// first.
func TestSplitByName(t *testing.T) {
	files := repoFiles("d/x-00001-of-00003.gguf", "d/x-00002-of-00003.gguf", "d/x-00003-of-00003.gguf")
	o := newRepoHub(t, &repoHub{files: files})
	p, err := Resolve(context.Background(), "hf://owner/repo/d/x-00002-of-00003.gguf", o)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(o.CacheDir, "hf/owner/repo/main/d/x-00001-of-00003.gguf"); p != want {
		t.Fatalf("path %s, want %s", p, want)
	}
	for name, data := range files {
		checkFile(t, filepath.Join(o.CacheDir, "hf/owner/repo/main", name), data)
	}
	// A missing file of the set is an error naming it.
	delete(files, "d/x-00003-of-00003.gguf")
	o2 := newRepoHub(t, &repoHub{files: files})
	if _, err := Resolve(context.Background(), "hf://owner/repo/d/x-00001-of-00003.gguf", o2); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "x-00003-of-00003.gguf") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(o2.CacheDir, "hf/owner/repo/main/d/x-00001-of-00003.gguf")); err != nil {
		t.Errorf("the files before the missing one stay in the cache: %v", err)
	}
}

func TestMatchesTag(t *testing.T) {
	for _, c := range []struct {
		key, tag string
		want     bool
	}{
		{"m-Q4_K_M.gguf", "q4_k_m", true},
		{"m-Q4_K_M.gguf", "Q4_K", false},
		{"m-IQ4_XS.gguf", "Q4_XS", false},
		{"m-UD-Q4_K_XL.gguf", "Q4_K_XL", true},
		{"m-UD-Q4_K_XL.gguf", "UD-Q4_K_XL", true},
		{"Q4_K_M/m.gguf", "q4_k_m", true},
		{"m.Q8_0.gguf", "Q8_0", true},
		{"m_f16.gguf", "F16", true},
		{"m-bf16.gguf", "f16", false},
		{"q8_0q8_0.gguf", "q8_0", false},
	} {
		if got := matchesTag(c.key, c.tag); got != c.want {
			t.Errorf("matchesTag(%q, %q) = %v", c.key, c.tag, got)
		}
	}
}
