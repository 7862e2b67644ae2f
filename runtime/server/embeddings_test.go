package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/tensor"
)

// embedHarness serves a random-weight bge-small ("bge", embeddings only), the stories model as
// a decoder embedder with last-token pooling as well as a generator ("stories-embed"), and the
// stories model for generation only ("stories").
type embedHarness struct {
	h   *harness
	bge *bert.Context // a context of its own over the same weights, for reference embeddings
}

func runEmbedder(t testing.TB, m sched.EmbedModel) *sched.Embedder {
	t.Helper()
	e, err := sched.NewEmbedder(m, sched.EmbedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(context.Background())
	}()
	t.Cleanup(func() {
		e.Close()
		<-done
	})
	return e
}

func newEmbedHarness(t *testing.T) *embedHarness {
	t.Helper()
	w, err := bert.Synth(bert.Shapes["bge-small"], tensor.Q8_0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "bge-small.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if k, err := models.Probe(path); err != nil || k != models.KindEmbedding {
		t.Fatalf("Probe: %v %v, want an embedding model", k, err)
	}
	be, _, err := backend.New("go", backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := models.OpenEncoder(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enc.Close() })
	bc, err := enc.Model.NewContext(bert.ContextConfig{StepTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bc.Close() })
	em, err := sched.NewEncoderEmbedModel(bc)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := enc.Model.NewContext(bert.ContextConfig{StepTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ref.Close() })

	p := modelPath(t)
	llm := openLLM(t, p)
	s1, _ := newSched(t, llm, sched.Config{}, true)
	s2, _ := newSched(t, llm, sched.Config{}, true)
	dc, err := llm.Model.NewContext(llama.ContextConfig{StepTokens: 128, MaxSeqs: 16, KVSlots: 128, KVType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	dm, err := sched.NewDecoderEmbedModel(dc, pooling.Last)
	if err != nil {
		t.Fatal(err)
	}
	served := []*Model{
		{Name: "bge", Tokenizer: enc.Text(), Embedder: runEmbedder(t, em)},
		{Name: "stories-embed", Tokenizer: llm.Text(), Sched: s1, Ctx: testCtx, Embedder: runEmbedder(t, dm)},
		llmModel("stories", llm, s2, testCtx),
	}
	h := &harness{}
	if h.s, err = New(Config{}, served); err != nil {
		t.Fatal(err)
	}
	h.s.SetReady(true)
	h.srv = httptest.NewServer(h.s.Handler())
	t.Cleanup(h.srv.Close)
	return &embedHarness{h: h, bge: ref}
}

type embedResp struct {
	Object string
	Data   []struct {
		Object    string
		Index     int
		Embedding json.RawMessage
	}
	Model string
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

// vectors reads the embeddings of a response, float or base64.
func (r *embedResp) vectors(t *testing.T) [][]float32 {
	t.Helper()
	out := make([][]float32, len(r.Data))
	for i, d := range r.Data {
		if d.Index != i || d.Object != "embedding" {
			t.Fatalf("data[%d]: index %d object %q", i, d.Index, d.Object)
		}
		var s string
		if json.Unmarshal(d.Embedding, &s) == nil {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(b)%4 != 0 {
				t.Fatalf("base64 embedding: %v", err)
			}
			for k := 0; k < len(b); k += 4 {
				out[i] = append(out[i], math.Float32frombits(binary.LittleEndian.Uint32(b[k:])))
			}
			continue
		}
		if err := json.Unmarshal(d.Embedding, &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func (eh *embedHarness) embed(t *testing.T, body map[string]any) (*embedResp, [][]float32) {
	t.Helper()
	resp, b := eh.h.post(t, "/v1/embeddings", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%v: status %d: %s", body, resp.StatusCode, b)
	}
	var r embedResp
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "list" || r.Model != body["model"] || r.Usage.PromptTokens == 0 || r.Usage.TotalTokens != r.Usage.PromptTokens {
		t.Fatalf("response %s", b)
	}
	return &r, r.vectors(t)
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

func unitNorm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// TestEmbeddings: every input form, both encodings, against the model's own embedding of each
// input alone; a decoder model as an embedder; concurrent requests batched together agree with
// requests alone.
func TestEmbeddings(t *testing.T) {
	eh := newEmbedHarness(t)
	texts := []string{"hello world", "the quick brown fox jumps over the lazy dog", "a"}
	_, all := eh.embed(t, map[string]any{"model": "bge", "input": texts})
	if len(all) != len(texts) {
		t.Fatalf("%d embeddings for %d inputs", len(all), len(texts))
	}
	enc := eh.h.s.byName["bge"].Tokenizer
	for i, text := range texts {
		toks, err := enc.Encode(text)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, 384)
		if err := eh.bge.Embed(toks, []int{len(toks)}, pooling.NormEuclidean, want); err != nil {
			t.Fatal(err)
		}
		if len(all[i]) != 384 || math.Abs(unitNorm(all[i])-1) > 1e-5 {
			t.Fatalf("input %d: %d values of norm %v", i, len(all[i]), unitNorm(all[i]))
		}
		if c := cosine(all[i], want); c < 0.99999 {
			t.Errorf("input %d: cosine %v with the model's own embedding", i, c)
		}
		_, one := eh.embed(t, map[string]any{"model": "bge", "input": text, "encoding_format": "base64", "dimensions": 384})
		if c := cosine(one[0], want); c < 0.99999 {
			t.Errorf("input %d alone, base64: cosine %v", i, c)
		}
		_, ids := eh.embed(t, map[string]any{"model": "bge", "input": toks})
		if c := cosine(ids[0], want); c < 0.99999 {
			t.Errorf("input %d as token ids: cosine %v", i, c)
		}
	}
	toks0, _ := enc.Encode(texts[0])
	toks1, _ := enc.Encode(texts[1])
	_, ids := eh.embed(t, map[string]any{"model": "bge", "input": [][]int32{toks0, toks1}})
	for i := range ids {
		if c := cosine(ids[i], all[i]); c < 0.99999 {
			t.Errorf("arrays of token ids, input %d: cosine %v", i, c)
		}
	}

	// Concurrent requests, batched by the scheduler, get what they get alone.
	var wg sync.WaitGroup
	for k := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := k % len(texts)
			resp, b := eh.h.post(t, "/v1/embeddings", map[string]any{"model": "bge", "input": []string{texts[i], texts[(i+1)%len(texts)]}})
			if resp.StatusCode != 200 {
				t.Errorf("concurrent %d: %d %s", k, resp.StatusCode, b)
				return
			}
			var r embedResp
			json.Unmarshal(b, &r)
			v := r.vectors(t)
			if c := cosine(v[0], all[i]); c < 0.99999 {
				t.Errorf("concurrent %d: cosine %v", k, c)
			}
		}()
	}
	wg.Wait()

	// A decoder as an embedder: last-token pooling, unit length, its own for each input.
	_, dv := eh.embed(t, map[string]any{"model": "stories-embed", "input": []string{"Once upon a time", "The cat sat"}})
	_, d0 := eh.embed(t, map[string]any{"model": "stories-embed", "input": "Once upon a time"})
	if len(dv) != 2 || math.Abs(unitNorm(dv[0])-1) > 1e-5 || cosine(dv[0], d0[0]) < 0.99999 || cosine(dv[0], dv[1]) > 0.9999 {
		t.Errorf("decoder embeddings: norms %v, batched against alone %v, two inputs %v", unitNorm(dv[0]), cosine(dv[0], d0[0]), cosine(dv[0], dv[1]))
	}
	// The same model still generates.
	if resp, b := eh.h.post(t, "/v1/completions", map[string]any{"model": "stories-embed", "prompt": "Once", "max_tokens": 3}); resp.StatusCode != 200 {
		t.Errorf("completion on a model that also embeds: %d %s", resp.StatusCode, b)
	}
}

// TestEmbeddingErrors: bad requests get the right 4xx in OpenAI's shape.
func TestEmbeddingErrors(t *testing.T) {
	eh := newEmbedHarness(t)
	h := eh.h
	long := make([]int, 600)
	cases := []struct {
		path, body, param, code string
	}{
		{"/v1/embeddings", `{"model":"bge"}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":""}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":[]}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":["a",""]}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":[[]]}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":[1,99999999]}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":5}`, "input", ""},
		{"/v1/embeddings", `{"model":"bge","input":"a","encoding_format":"int8"}`, "encoding_format", ""},
		{"/v1/embeddings", `{"model":"bge","input":"a","dimensions":128}`, "dimensions", "unsupported_parameter"},
		{"/v1/embeddings", `{"model":"bge","input":"a","dimensions":0}`, "dimensions", ""},
		{"/v1/embeddings", fmt.Sprintf(`{"model":"bge","input":%s}`, mustJSON(long)), "input", "context_length_exceeded"},
		{"/v1/embeddings", `{"model":"stories","input":"a"}`, "model", "model_not_supported"},
		{"/v1/completions", `{"model":"bge","prompt":"a"}`, "model", "model_not_supported"},
		{"/v1/chat/completions", `{"model":"bge","messages":[{"role":"user","content":"a"}]}`, "model", "model_not_supported"},
	}
	for _, c := range cases {
		h.expectError(t, c.path, c.body, c.param, c.code)
	}
	if resp, _ := h.do(t, "POST", "/v1/embeddings", `{"model":"nope","input":"a"}`); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d", resp.StatusCode)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
