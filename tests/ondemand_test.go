package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// odModel is a model's object in GET /v1/models, with Parley's fields.
type odModel struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Kind        string `json:"kind"`
	State       string `json:"state"`
	OnDemand    bool   `json:"on_demand"`
	MemoryBytes int64  `json:"memory_bytes"`
}

func odModels(t *testing.T, base string) map[string]odModel {
	t.Helper()
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []odModel `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]odModel{}
	for _, m := range list.Data {
		out[m.ID] = m
	}
	return out
}

// odWaitState waits until the named model is in state want.
func odWaitState(t *testing.T, base, name, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if odModels(t, base)[name].State == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: state %q, want %q", name, odModels(t, base)[name].State, want)
}

func odMetric(t *testing.T, base, series string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func odPost(t *testing.T, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeOnDemand serves a models directory of a language model and a Whisper model: both
// listed unloaded, each loaded by its first request (concurrent ones loading it once), unloaded
// by keep_alive 0 and by the admin endpoint, and under a --max-memory that holds one at a time,
// the idle one unloaded for the other; a model larger than the budget is refused with the sizes.
func TestServeOnDemand(t *testing.T) {
	sameInBothBuilds(t)
	llm := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	whisper := sharedtest.WhisperRandomModel(t, "tiny")
	wav, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for dst, src := range map[string]string{"stories.gguf": llm, "whisper.bin": whisper} {
		if err := os.Symlink(src, filepath.Join(dir, dst)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--backend", "go", "--models-dir", dir, "--ctx", "128", "--parallel", "2"}
	completion := `{"model":"stories","prompt":"Once upon a time","max_tokens":4,"temperature":0}`

	srv := startServer(t, append(args, "--keep-alive", "-1")...)
	ms := odModels(t, srv.base)
	if len(ms) != 2 || ms["stories"].Kind != "llm" || ms["whisper"].Kind != "speech_recognition" {
		t.Fatalf("models: %+v", ms)
	}
	for _, m := range ms {
		if m.State != "unloaded" || !m.OnDemand || m.MemoryBytes <= 0 || m.Object != "model" {
			t.Errorf("before any request: %+v", m)
		}
	}
	sizeLLM, sizeASR := ms["stories"].MemoryBytes, ms["whisper"].MemoryBytes

	t.Run("first requests load once", func(t *testing.T) {
		var wg sync.WaitGroup
		codes := make([]int, 4)
		for i := range codes {
			wg.Go(func() { codes[i], _ = odPost(t, srv.base+"/v1/completions", completion) })
		}
		wg.Wait()
		for i, c := range codes {
			if c != 200 {
				t.Errorf("request %d: %d", i, c)
			}
		}
		if v := odMetric(t, srv.base, `parley_model_loads_total{model="stories",result="ok"}`); v != "1" {
			t.Errorf("stories loads: %q, want 1", v)
		}
		ms := odModels(t, srv.base)
		if ms["stories"].State != "loaded" || ms["whisper"].State != "unloaded" {
			t.Errorf("after a completion: stories %s, whisper %s", ms["stories"].State, ms["whisper"].State)
		}
		if v := odMetric(t, srv.base, "parley_models_loaded"); v != "1" {
			t.Errorf("parley_models_loaded %q, want 1", v)
		}
		if v, _ := strconv.ParseFloat(odMetric(t, srv.base, `parley_model_memory_bytes{model="stories"}`), 64); int64(v) != sizeLLM {
			t.Errorf("parley_model_memory_bytes of stories: %v, want %d", v, sizeLLM)
		}
	})

	t.Run("keep_alive 0", func(t *testing.T) {
		code, _, body := postTranscription(t, srv.base, wav, "model", "whisper", "keep_alive", "0", "response_format", "text")
		if code != 200 || strings.TrimSpace(body) == "" {
			t.Fatalf("transcription: %d %q", code, body)
		}
		odWaitState(t, srv.base, "whisper", "unloaded")
		if v := odMetric(t, srv.base, `parley_model_unloads_total{model="whisper"}`); v != "1" {
			t.Errorf("whisper unloads: %q, want 1", v)
		}
	})

	t.Run("admin endpoints", func(t *testing.T) {
		code, body := odPost(t, srv.base+"/v1/models/stories/unload", "")
		if code != 200 || !strings.Contains(body, `"state":"unloaded"`) {
			t.Errorf("unload: %d %s", code, body)
		}
		if code, body := odPost(t, srv.base+"/v1/models/stories/unload", ""); code != 200 {
			t.Errorf("unload of an unloaded model: %d %s", code, body)
		}
		code, body = odPost(t, srv.base+"/v1/models/whisper/load", `{"keep_alive":"1h"}`)
		if code != 200 || !strings.Contains(body, `"state":"loaded"`) {
			t.Errorf("load: %d %s", code, body)
		}
		if st := odModels(t, srv.base)["whisper"].State; st != "loaded" {
			t.Errorf("whisper after load: %s", st)
		}
		if code, body := odPost(t, srv.base+"/v1/models/nothing/load", ""); code != 404 || !strings.Contains(body, "model_not_found") {
			t.Errorf("load of an unknown model: %d %s", code, body)
		}
		if code, body := odPost(t, srv.base+"/v1/completions", `{"model":"nothing","prompt":"x"}`); code != 404 {
			t.Errorf("unknown model: %d %s", code, body)
		}
		if code, body := odPost(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"x","keep_alive":"soon"}`); code != 400 || !strings.Contains(body, "keep_alive") {
			t.Errorf("bad keep_alive: %d %s", code, body)
		}
	})

	t.Run("eviction under --max-memory", func(t *testing.T) {
		budget := max(sizeLLM, sizeASR) + min(sizeLLM, sizeASR)/2 // one at a time
		srv := startServer(t, append(args, "--keep-alive", "-1", "--max-memory", strconv.FormatInt(budget, 10))...)
		if code, body := odPost(t, srv.base+"/v1/completions", completion); code != 200 {
			t.Fatalf("completion: %d %s", code, body)
		}
		if code, _, body := postTranscription(t, srv.base, wav, "model", "whisper", "response_format", "text"); code != 200 {
			t.Fatalf("transcription: %d %s", code, body)
		}
		ms := odModels(t, srv.base)
		if ms["whisper"].State != "loaded" || ms["stories"].State != "unloaded" {
			t.Errorf("after the transcription: stories %s, whisper %s; want stories unloaded for whisper", ms["stories"].State, ms["whisper"].State)
		}
		if code, body := odPost(t, srv.base+"/v1/completions", completion); code != 200 {
			t.Fatalf("completion: %d %s", code, body)
		}
		ms = odModels(t, srv.base)
		if ms["stories"].State != "loaded" || ms["whisper"].State != "unloaded" {
			t.Errorf("after the second completion: stories %s, whisper %s", ms["stories"].State, ms["whisper"].State)
		}
		if v := odMetric(t, srv.base, `parley_model_unloads_total{model="stories"}`); v != "1" {
			t.Errorf("stories unloads: %q, want 1", v)
		}
	})

	t.Run("larger than the budget", func(t *testing.T) {
		budget := min(sizeLLM, sizeASR) + 1
		srv := startServer(t, append(args, "--max-memory", strconv.FormatInt(budget, 10), "--api-key", "k")...)
		big := "stories"
		if sizeASR > sizeLLM {
			big = "whisper"
		}
		code, body := odPost(t, srv.base+"/v1/models/"+big+"/load", "", "Authorization", "Bearer k")
		if code != 503 || !strings.Contains(body, "insufficient_memory") || !strings.Contains(body, "MiB") {
			t.Errorf("load of a model larger than the budget: %d %s", code, body)
		}
		if strings.Contains(srv.stderr.String(), "model loaded on demand") {
			t.Errorf("%s was loaded", big)
		}
		if code, _ := odPost(t, srv.base+"/v1/models/"+big+"/unload", ""); code != 401 {
			t.Errorf("unload without the API key: %d, want 401", code)
		}
	})

	t.Run("config file", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "parley.yaml")
		body := "backend: go\nctx: 128\nmodels:\n  - path: " + llm + "\n    alias: lazy\n    on-demand: true\n    keep-alive: 0\n  - path: " + llm + "\n    alias: eager\n"
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		srv := startServer(t, "--config", cfg)
		ms := odModels(t, srv.base)
		if ms["lazy"].State != "unloaded" || !ms["lazy"].OnDemand || ms["eager"].State != "loaded" || ms["eager"].OnDemand {
			t.Fatalf("models: %+v", ms)
		}
		if code, body := odPost(t, srv.base+"/v1/completions", strings.ReplaceAll(completion, "stories", "lazy")); code != 200 {
			t.Fatalf("completion: %d %s", code, body)
		}
		odWaitState(t, srv.base, "lazy", "unloaded") // keep-alive 0
		if code, body := odPost(t, srv.base+"/v1/models/eager/unload", ""); code != 400 || !strings.Contains(body, "model_not_on_demand") {
			t.Errorf("unload of a model loaded at start: %d %s", code, body)
		}
	})
}

// TestServeOnDemandLRU serves three models from a directory under a --max-memory that holds two
// of them: the third request's model evicts the least recently used one and the other stays;
// concurrent requests for a model that is loading all succeed on one load; and an idle model
// unloads once its keep-alive, a request's or the --keep-alive flag's, has passed.
func TestServeOnDemandLRU(t *testing.T) {
	llm := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	dir := t.TempDir()
	names := []string{"a", "b", "c"}
	for _, n := range names {
		if err := os.Symlink(llm, filepath.Join(dir, n+".gguf")); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--backend", "go", "--models-dir", dir, "--ctx", "128", "--parallel", "2"}
	complete := func(base, model, extra string) (int, string) {
		return odPost(t, base+"/v1/completions", `{"model":"`+model+`","prompt":"Once upon a time","max_tokens":4,"temperature":0`+extra+`}`)
	}
	states := func(base string) string {
		ms := odModels(t, base)
		var s []string
		for _, n := range names {
			s = append(s, n+"="+ms[n].State)
		}
		return strings.Join(s, " ")
	}

	// Sizes as the server estimates them, from a server with no budget.
	ms := odModels(t, startServer(t, args...).base)
	var sizes []int64
	for _, n := range names {
		if m := ms[n]; m.State != "unloaded" || m.MemoryBytes <= 0 {
			t.Fatalf("%s before any request: %+v", n, m)
		}
		sizes = append(sizes, ms[n].MemoryBytes)
	}
	slices.Sort(sizes)
	budget := sizes[1] + sizes[2] // any two fit, all three do not
	if sizes[0]+sizes[1]+sizes[2] <= budget {
		t.Fatalf("sizes %v: three models fit in %d", sizes, budget)
	}
	srv := startServer(t, append(args, "--keep-alive", "-1", "--max-memory", strconv.FormatInt(budget, 10))...)

	t.Run("concurrent requests load once", func(t *testing.T) {
		var wg sync.WaitGroup
		codes, bodies := make([]int, 8), make([]string, 8)
		for i := range codes {
			wg.Go(func() { codes[i], bodies[i] = complete(srv.base, "a", "") })
		}
		wg.Wait()
		for i, c := range codes {
			if c != 200 {
				t.Errorf("request %d: %d %s", i, c, bodies[i])
			}
		}
		if v := odMetric(t, srv.base, `parley_model_loads_total{model="a",result="ok"}`); v != "1" {
			t.Errorf("loads of a: %q, want 1", v)
		}
		if st := states(srv.base); st != "a=loaded b=unloaded c=unloaded" {
			t.Errorf("after the requests for a: %s", st)
		}
	})

	t.Run("least recently used evicted", func(t *testing.T) {
		if code, body := complete(srv.base, "b", ""); code != 200 {
			t.Fatalf("b: %d %s", code, body)
		}
		if st := states(srv.base); st != "a=loaded b=loaded c=unloaded" {
			t.Fatalf("after b: %s; want a and b loaded", st)
		}
		if code, body := complete(srv.base, "c", ""); code != 200 {
			t.Fatalf("c: %d %s", code, body)
		}
		if st := states(srv.base); st != "a=unloaded b=loaded c=loaded" {
			t.Errorf("after c: %s; want a, the least recently used, unloaded", st)
		}
		if v := odMetric(t, srv.base, `parley_model_unloads_total{model="a"}`); v != "1" {
			t.Errorf("unloads of a: %q, want 1", v)
		}
		for _, n := range []string{"b", "c"} {
			if v := odMetric(t, srv.base, `parley_model_unloads_total{model="`+n+`"}`); v != "" && v != "0" {
				t.Errorf("unloads of %s: %q, want none", n, v)
			}
		}
		if v := odMetric(t, srv.base, "parley_models_loaded"); v != "2" {
			t.Errorf("parley_models_loaded %q, want 2", v)
		}
		// b was used before c: a request for a now evicts b.
		if code, body := complete(srv.base, "a", ""); code != 200 {
			t.Fatalf("a again: %d %s", code, body)
		}
		if st := states(srv.base); st != "a=loaded b=unloaded c=loaded" {
			t.Errorf("after a again: %s; want b, the least recently used, unloaded", st)
		}
		if v := odMetric(t, srv.base, `parley_model_unloads_total{model="b"}`); v != "1" {
			t.Errorf("unloads of b: %q, want 1", v)
		}
	})

	// idleUnload requests model, whose keep-alive is keep (the request's, when extra gives it),
	// and checks it loaded after the request, then unloaded within a generous bound.
	idleUnload := func(t *testing.T, base, model, extra string, keep time.Duration) {
		t.Helper()
		start := time.Now()
		if code, body := complete(base, model, extra); code != 200 {
			t.Fatalf("%s: %d %s", model, code, body)
		}
		end := time.Now()
		if st := odModels(t, base)[model].State; st != "loaded" && time.Since(end) < keep {
			t.Errorf("%s right after its request: %s, want loaded", model, st)
		}
		deadline := end.Add(15 * time.Second)
		for odModels(t, base)[model].State != "unloaded" {
			if time.Now().After(deadline) {
				t.Fatalf("%s still %s 15 s after its last request, with a keep-alive of %v", model, odModels(t, base)[model].State, keep)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if took := time.Since(start); took < keep {
			t.Errorf("%s unloaded %v after its request began, before its keep-alive of %v", model, took, keep)
		}
		t.Logf("%s unloaded within %v of its request's end", model, time.Since(end).Round(time.Millisecond))
	}

	t.Run("request keep_alive", func(t *testing.T) {
		unloads := odMetric(t, srv.base, `parley_model_unloads_total{model="c"}`)
		idleUnload(t, srv.base, "c", `,"keep_alive":"1s"`, time.Second)
		if v := odMetric(t, srv.base, `parley_model_unloads_total{model="c"}`); v != "1" || unloads != "" && unloads != "0" {
			t.Errorf("unloads of c: %q then %q, want none then 1", unloads, v)
		}
		if st := odModels(t, srv.base)["a"].State; st != "loaded" {
			t.Errorf("a, with a keep-alive of -1: %s", st)
		}
	})

	t.Run("--keep-alive", func(t *testing.T) {
		srv := startServer(t, append(args, "--keep-alive", "1s")...)
		idleUnload(t, srv.base, "b", "", time.Second)
	})
}
