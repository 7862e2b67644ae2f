package tests

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
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
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	return srv, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

// splitFile returns file no (0-based) of a split GGUF set of count files, as gguf-split writes
// the first one's header (split.no, split.count).
func splitFile(t *testing.T, no, count int) []byte {
	t.Helper()
	w := gguf.NewWriter()
	w.SetString("general.architecture", "llama")
	w.Set("split.no", gguf.Value{Type: gguf.Uint16, V: uint16(no)})
	w.Set("split.count", gguf.Value{Type: gguf.Uint16, V: uint16(count)})
	if err := w.AddTensor("t"+string(rune('a'+no)), tensor.F32, []int64{4}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "split.gguf")
	if err := w.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPull: parley pull downloads hf:// models into the cache with a progress bar and prints
// their paths; a quantisation tag picks its file from the repository's list, case-insensitively,
// a split model comes whole, and a tag matching no file or several is an error listing what the
// repository has. A model pulled by tag then runs offline from the cache.
func TestPull(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"README.md":                            []byte("# stories"),
		"stories-F32.gguf":                     data,
		"stories-Q4_K_M.gguf":                  []byte("not fetched"),
		"other-Q4_K_M.gguf":                    []byte("not fetched"),
		"big/stories-Q8_0-00001-of-00003.gguf": splitFile(t, 0, 3),
		"big/stories-Q8_0-00002-of-00003.gguf": splitFile(t, 1, 3),
		"big/stories-Q8_0-00003-of-00003.gguf": splitFile(t, 2, 3),
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
		{"split model not loaded yet", []string{"generate", "-m", "hf://owner/repo:Q8_0", "-p", "x"}, 1, []string{"file 1 of 3 of a split model", "llama-gguf-split --merge"}},
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

	// A tag resolves to the model in the cache with the hub out of reach.
	offline := []string{"PARLEY_HF_ENDPOINT=http://127.0.0.1:1", "PARLEY_CACHE=" + cache}
	res = parleyEnv(t, offline, "generate", "--backend", "go", "-m", "hf://owner/repo:f32", "-p", "Once", "-n", "4", "--temp", "0")
	if res.code != 0 || res.stdout == "" {
		t.Errorf("offline generate by tag: exit %d\n%s", res.code, res.stderr)
	}
}
