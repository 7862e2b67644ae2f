package tests

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// repoHub stands in for the Hugging Face hub's repository owner/repo at revision main: its file
// list (/api/models/owner/repo/tree/main?recursive=true) and each file
// (/owner/repo/resolve/main/PATH), counting the downloads of each file.
func repoHub(t *testing.T, files map[string][]byte) (*httptest.Server, func() map[string]int) {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/models/owner/repo/tree/main" {
			type entry struct {
				Type string `json:"type"`
				Path string `json:"path"`
			}
			var out []entry
			for p := range files {
				out = append(out, entry{"file", p})
			}
			json.NewEncoder(w).Encode(out)
			return
		}
		p, ok := strings.CutPrefix(r.URL.Path, "/owner/repo/resolve/main/")
		data, found := files[p]
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		got[p]++
		mu.Unlock()
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	return srv, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

// splitModel returns the files of the model at path written as gguf-split writes it in count
// files: the first with the model's metadata, each with its share of the tensors and split.no
// and split.count.
func splitModel(t *testing.T, path string, count int) [][]byte {
	t.Helper()
	src, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var out [][]byte
	per := (len(src.Tensors) + count - 1) / count
	for i := range count {
		w := gguf.NewWriter()
		if i == 0 {
			for _, kv := range src.KVs {
				w.Set(kv.Key, kv.Value)
			}
			w.Set("split.tensors.count", gguf.Value{Type: gguf.Int32, V: int32(len(src.Tensors))})
		}
		w.Set("split.no", gguf.Value{Type: gguf.Uint16, V: uint16(i)})
		w.Set("split.count", gguf.Value{Type: gguf.Uint16, V: uint16(count)})
		for _, ti := range src.Tensors[min(i*per, len(src.Tensors)):min((i+1)*per, len(src.Tensors))] {
			if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, src.TensorData(&ti)); err != nil {
				t.Fatal(err)
			}
		}
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Bytes())
	}
	return out
}

// TestPull: parley pull downloads hf:// models into the cache with a progress bar and prints
// their paths; a quantisation tag picks its file from the repository's list, case-insensitively,
// a split model comes whole and runs as the file it was split from, and a tag matching no file
// or several is an error listing what the repository has. A model pulled by tag then runs
// offline from the cache.
func TestPull(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	parts := splitModel(t, model, 3)
	files := map[string][]byte{
		"README.md":                            []byte("# stories"),
		"stories-F32.gguf":                     data,
		"stories-Q4_K_M.gguf":                  []byte("not fetched"),
		"other-Q4_K_M.gguf":                    []byte("not fetched"),
		"big/stories-Q8_0-00001-of-00003.gguf": parts[0],
		"big/stories-Q8_0-00002-of-00003.gguf": parts[1],
		"big/stories-Q8_0-00003-of-00003.gguf": parts[2],
	}
	hubSrv, downloads := repoHub(t, files)
	cache := t.TempDir()
	env := []string{"PARLEY_HF_ENDPOINT=" + hubSrv.URL, "PARLEY_CACHE=" + cache}
	local := func(p string) string {
		return filepath.Join(cache, "hf", "owner", "repo", "main", filepath.FromSlash(p))
	}

	res := parleyEnv(t, env, "pull", "hf://owner/repo:q8_0", "hf://owner/repo/stories-F32.gguf")
	if res.code != 0 {
		t.Fatalf("pull: exit %d\n%s", res.code, res.stderr)
	}
	want := local("big/stories-Q8_0-00001-of-00003.gguf") + "\n" + local("stories-F32.gguf") + "\n"
	if res.stdout != want {
		t.Errorf("pull printed %q, want %q", res.stdout, want)
	}
	if !strings.Contains(res.stderr, "100.0%") {
		t.Errorf("no progress bar on stderr:\n%q", res.stderr)
	}
	for p, b := range files {
		got, err := os.ReadFile(local(p))
		fetched := strings.Contains(p, "Q8_0") || p == "stories-F32.gguf"
		switch {
		case fetched && (err != nil || string(got) != string(b)):
			t.Errorf("%s: not in the cache as served (%v)", p, err)
		case !fetched && err == nil:
			t.Errorf("%s fetched, though no name asked for it", p)
		}
	}

	// Pulled already: nothing is downloaded again.
	before := downloads()
	if res := parleyEnv(t, env, "pull", "--quiet", "hf://owner/repo/stories-F32.gguf"); res.code != 0 || res.stderr != "" {
		t.Errorf("second pull: exit %d, stderr %q", res.code, res.stderr)
	}
	if after := downloads(); !maps.Equal(before, after) {
		t.Errorf("second pull downloaded again: %v, then %v", before, after)
	}

	for _, c := range []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"several match", []string{"pull", "hf://owner/repo:Q4_K_M"}, 1, []string{`2 models in the repository match "Q4_K_M"`, "other-Q4_K_M.gguf, stories-Q4_K_M.gguf"}},
		{"none matches", []string{"pull", "hf://owner/repo:IQ2_XS"}, 1, []string{`no GGUF file in the repository matches "IQ2_XS"`, "big/stories-Q8_0.gguf (3 files), other-Q4_K_M.gguf, stories-F32.gguf, stories-Q4_K_M.gguf"}},
		{"no such repository", []string{"pull", "hf://owner/nothing:Q8_0"}, 1, []string{"no such repository"}},
		{"malformed name", []string{"pull", "hf://owner/repo"}, 2, []string{"invalid model name"}},
		{"no name", []string{"pull"}, 2, []string{"want at least one hf:// name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := parleyEnv(t, env, c.args...)
			if res.code != c.code {
				t.Errorf("exit %d, want %d\n%s", res.code, c.code, res.stderr)
			}
			for _, s := range c.says {
				if !strings.Contains(res.stderr, s) {
					t.Errorf("stderr does not say %q:\n%s", s, res.stderr)
				}
			}
		})
	}

	// A tag resolves to the model in the cache with the hub out of reach; the split model
	// generates what the file it was split from does.
	offline := []string{"PARLEY_HF_ENDPOINT=http://127.0.0.1:1", "PARLEY_CACHE=" + cache}
	gen := func(m string) string {
		res := parleyEnv(t, offline, "generate", "--backend", "go", "-m", m, "-p", "Once upon a time", "-n", "16", "--temp", "0")
		if res.code != 0 || res.stdout == "" {
			t.Fatalf("offline generate -m %s: exit %d\n%s", m, res.code, res.stderr)
		}
		return res.stdout
	}
	want = gen(model)
	for _, m := range []string{"hf://owner/repo:f32", "hf://owner/repo:Q8_0", local("big/stories-Q8_0-00001-of-00003.gguf")} {
		if got := gen(m); got != want {
			t.Errorf("-m %s generated %q, the original %q", m, got, want)
		}
	}
}
