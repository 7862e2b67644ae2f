package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestOnDemandHTTP: an on-demand model is listed unloaded, loaded by its first request, held
// while a stream of it is open (an unload then answers 202 and happens when the stream ends),
// and its load's failure reaches the client.
func TestOnDemandHTTP(t *testing.T) {
	e := openLLM(t, modelPath(t))
	var loads, closes atomic.Int32
	var fail atomic.Bool
	load := func(context.Context) (*Loaded, error) {
		loads.Add(1)
		if fail.Load() {
			return nil, errTestLoad
		}
		s, _ := newSched(t, e, slowSteps, true)
		return &Loaded{Model: llmModel("", e, s, testCtx), Close: func() { s.Close(); closes.Add(1) }}, nil
	}
	srv, err := New(Config{OnDemand: []*OnDemandModel{
		{Name: "lazy", Kind: KindLLM, Bytes: 1 << 20, KeepAlive: -1, Load: load},
		{Name: "emb", Kind: KindEmbedding, Bytes: 1 << 20, KeepAlive: -1, Load: load},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetReady(true)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	t.Cleanup(func() { srv.CloseModels(context.Background()) })
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
		}
		return resp.StatusCode, b.String()
	}
	state := func() string {
		t.Helper()
		resp, err := http.Get(hs.URL + "/v1/models/lazy")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m modelObject
		json.NewDecoder(resp.Body).Decode(&m)
		if m.Kind != KindLLM || !m.OnDemand || m.MemoryBytes != 1<<20 {
			t.Errorf("model object %+v", m)
		}
		return m.State
	}
	if st := state(); st != stateUnloaded {
		t.Fatalf("before any request: %s", st)
	}
	if code, body := post("/v1/completions", `{"model":"lazy","prompt":"Once","max_tokens":2,"keep_alive":[1]}`); code != 400 || !strings.Contains(body, "keep_alive") {
		t.Errorf("keep_alive of the wrong type: %d %s", code, body)
	}
	if code, body := post("/v1/chat/completions", `{"model":"emb","messages":[{"role":"user","content":"hi"}]}`); code != 400 || !strings.Contains(body, "embedding model") || loads.Load() != 0 {
		t.Errorf("chat with an embedding model: %d %s, %d loads", code, body, loads.Load())
	}

	// A stream holds the model: the unload waits for its end.
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"lazy","prompt":"Once","max_tokens":60,"stream":true,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no event")
	}
	if code, body := post("/v1/models/lazy/unload", ""); code != 202 || !strings.Contains(body, `"state":"loaded"`) {
		t.Errorf("unload while streaming: %d %s", code, body)
	}
	if closes.Load() != 0 {
		t.Errorf("unloaded under an open stream")
	}
	if mr, err := http.Get(hs.URL + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(mr.Body)
		mr.Body.Close()
		for _, want := range []string{`parley_active_sequences{model="lazy"} 1`, `parley_model_memory_bytes{model="lazy"} 1.048576e+06`, "parley_models_loaded 1", `parley_model_loads_total{model="lazy",result="ok"} 1`} {
			if !strings.Contains(string(b), want+"\n") {
				t.Errorf("metrics lack %s", want)
			}
		}
	}
	for sc.Scan() {
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for state() != stateUnloaded && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if closes.Load() != 1 {
		t.Errorf("%d closes after the stream, want 1", closes.Load())
	}

	fail.Store(true)
	if code, body := post("/v1/completions", `{"model":"lazy","prompt":"Once","max_tokens":2}`); code != 500 || !strings.Contains(body, "model_load_failed") || !strings.Contains(body, errTestLoad.Error()) {
		t.Errorf("failed load: %d %s", code, body)
	}
	fail.Store(false)
	if code, body := post("/v1/completions", `{"model":"lazy","prompt":"Once","max_tokens":2,"keep_alive":0}`); code != 200 {
		t.Errorf("after a failed load: %d %s", code, body)
	}
	for state() != stateUnloaded && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := loads.Load(); n != 3 || closes.Load() != 2 {
		t.Errorf("%d loads, %d closes; want 3, 2", n, closes.Load())
	}
}

var errTestLoad = &testLoadError{}

type testLoadError struct{}

func (*testLoadError) Error() string { return "the weights are not there" }
