package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/engine"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// plain hides a backend's optional interfaces (backend.Argmaxer among them).
type plain struct{ backend.Backend }

func synthFile(t *testing.T) string {
	t.Helper()
	w, err := llama.Synth(llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 128, Vocab: 512}, tensor.Q8_0, 4)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTo(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func generate(t *testing.T, path string, be backend.Backend, req engine.Request) []int32 {
	t.Helper()
	e, err := engine.Open(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c, err := e.NewContext(engine.ContextOptions{Ctx: 128, KVType: tensor.F16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := e.Generate(context.Background(), c, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}

// TestGenerateChooses: Generate takes a greedy sequence's tokens from a backend that finds the
// argmax where the logits are (the same tokens as from the logits), and a sampling sequence's
// from a backend that draws there (backend.Draw's rule, from the sampler's random stream, one
// draw a token), as the server's scheduler does; with log-probabilities it keeps the logits.
func TestGenerateChooses(t *testing.T) {
	path := synthFile(t)
	newGo := func() backend.Backend {
		be, _, err := backend.New("go", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	}
	prompt := []int32{1, 300, 301, 302}
	greedy := decode.DefaultParams()
	greedy.Temperature = 0
	req := engine.Request{Prompt: prompt, MaxTokens: 12, Sampling: greedy, IgnoreEOS: true}
	if a, b := generate(t, path, newGo(), req), generate(t, path, plain{newGo()}, req); !slices.Equal(a, b) {
		t.Fatalf("greedy: %v with the backend's argmax, %v from the logits", a, b)
	}

	sp := decode.DefaultParams()
	sp.Seed = 11
	req.Sampling = sp
	d := &backendtest.Drawing{Backend: newGo()}
	got := generate(t, path, d, req)
	if d.Calls != len(got) {
		t.Errorf("%d draws by the backend for %d tokens", d.Calls, len(got))
	}
	// The reference: the same steps, drawn here by the host rule.
	want := func() []int32 {
		be := newGo()
		m, err := engine.Open(path, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := m.NewContext(engine.ContextOptions{Ctx: 128, KVType: tensor.F16})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		smp, err := decode.NewSampler(sp, m.Model.Vocab)
		if err != nil {
			t.Fatal(err)
		}
		dr, _ := smp.Drawable()
		seq := c.Pool().NewSeq(128)
		var bb kvcache.BatchBuilder
		lg := make([]float32, m.Model.Vocab)
		id := []int32{0}
		var gen []int32
		for toks := prompt; len(gen) < 12; toks = id {
			bb.Reset()
			if err := seq.Reserve(len(toks)); err != nil {
				t.Fatal(err)
			}
			if err := bb.Add(seq, len(toks)); err != nil {
				t.Fatal(err)
			}
			if err := c.Forward(toks, bb.Batch(), []int32{int32(len(toks) - 1)}, lg); err != nil {
				t.Fatal(err)
			}
			if err := seq.Advance(len(toks)); err != nil {
				t.Fatal(err)
			}
			dr.Random = smp.NextRandom()
			if err := backend.DrawRows(lg, m.Model.Vocab, []backend.Draw{dr}, id); err != nil {
				t.Fatal(err)
			}
			gen = append(gen, id[0])
		}
		return gen
	}()
	if !slices.Equal(got, want) {
		t.Fatalf("drawn by the backend: %v, want %v", got, want)
	}

	req.TopLogprobs = 2
	calls := d.Calls
	generate(t, path, d, req)
	if d.Calls != calls {
		t.Errorf("with log-probabilities the backend drew %d tokens, want none", d.Calls-calls)
	}
}
