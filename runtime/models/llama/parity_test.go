package llama_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// refGen is llama.cpp's greedy output (../shared/reference/llm/gen-*.json, format llm-ref-v1).
type refGen struct {
	ModelFile string `json:"model_file"`
	Results   []struct {
		PromptID     string  `json:"prompt_id"`
		PromptTokens []int32 `json:"prompt_tokens"`
		Generated    []int32 `json:"generated_token_ids"`
		Steps        []struct {
			ID      int32   `json:"id"`
			Logprob float64 `json:"logprob"`
			Top5    []struct {
				ID      int32   `json:"id"`
				Logprob float64 `json:"logprob"`
			} `json:"top5"`
		} `json:"steps"`
	} `json:"results"`
}

// parityCases bound how far Parley's teacher-forced top-5 log-probabilities may lie from
// llama.cpp's, per weight type: the median over every compared value, and the largest.
//
// llama.cpp keeps keys and values in F16 and, in its attention at the reference commit, also
// rounds each query and each softmax weight to F16 before the products (ggml_mul_mat converts its
// F32 operand to F16); for quantised weights it quantises every activation row to Q8_0. Parley
// does the same conversions, but its F32 sums run in a different order, so a value that lies
// within an F32 rounding error of an F16 (or Q8_0) rounding boundary can round the other way.
// Each such flip moves one element by one F16 ulp (1/1024 relative) or one Q8_0 step (1/127 of
// the block's largest value), and, once in the KV cache, it stays for every later token. A
// float64 implementation of the same graph shows the same spread against llama.cpp. Hence:
//   - median: most values agree to about 1e-4 (F32: 1e-4 to 3.1e-4 depending on where a backend's
//     flips fall, and so on the host: the CUDA backend on its CPU emulation, whose cuBLAS
//     products go to OpenBLAS and its kernels for the host, gives 3.0e-4 and 3.1e-4 on a
//     processor without AVX-512;
//     two of Parley's backends agree with each other to 4e-6 until the first flip and to 3e-3
//     after it; Q4_0 agrees to 1e-6). F16 and Q8_0 weights
//     stay further off (medians about 1.5e-3 and 8e-3) although a float64 implementation that
//     converts activations as described shows the same spread. For Q8_0 the kernels round in
//     different places: llama.cpp's x86 dot product (ggml_vec_dot_q8_0_q8_0) keeps eight F32
//     partial sums across the blocks, one per four-element lane, and adds them at the end, where
//     Parley adds each block's exact integer sum once, scaled (see native/cpu/packed.c); F16's
//     we have not traced;
//   - max: single flips reach about 3e-2 (F32, F16) and 0.4 (Q8_0, Q4_0, whose activation
//     steps are coarser).
//
// nearTie is the top-1/top-2 margin under which the greedy choice may flip from the same causes;
// greedy ids must agree wherever the reference's margin is larger (for F32: at every step).
var parityCases = []struct {
	model, ref      string
	median, maxDiff float64
	nearTie         float64
}{
	{"stories260K-f32.gguf", "gen-stories260K-f32.json", 4e-4, 3e-2, 0},
	{"stories260K-ffn192-f32.gguf", "gen-stories260K-ffn192-f32.json", 4e-4, 3e-2, 0},
	{"stories260K-ffn192-f16.gguf", "gen-stories260K-ffn192-f16.json", 3e-3, 3e-2, 2e-2},
	{"stories260K-ffn192-q8_0.gguf", "gen-stories260K-ffn192-q8_0.json", 1.5e-2, 0.4, 0.2},
	{"stories260K-ffn192-q4_0.gguf", "gen-stories260K-ffn192-q4_0.json", 1e-3, 0.4, 0.2},
	// llama.cpp's own output for this file is wrong at its commit; the F16 model must match the
	// F32 reference up to the F16 rounding of its weights.
	{"stories260K-f16.gguf", "gen-stories260K-f32.json", 1e-2, 0.1, 0.1},
}

// backendsUnderTest starts every backend this build has that runs here (see sharedtest.Backends).
func backendsUnderTest(t *testing.T) []backend.Backend { return sharedtest.Backends(t, 2) }

func logSoftmax(logits []float32, dst []float64) {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(sum)
	for i, v := range logits {
		dst[i] = float64(v) - lse
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// runner drives one sequence through a Context for tests.
type runner struct {
	c   *llama.Context
	seq *kvcache.Seq
	bb  kvcache.BatchBuilder
}

func (r *runner) feed(t *testing.T, toks []int32, logits []float32) {
	t.Helper()
	chunk := r.c.Config().StepTokens
	for len(toks) > 0 {
		n := min(chunk, len(toks))
		if err := r.seq.Reserve(n); err != nil {
			t.Fatal(err)
		}
		r.bb.Reset()
		if err := r.bb.Add(r.seq, n); err != nil {
			t.Fatal(err)
		}
		var out []int32
		var lg []float32
		if n == len(toks) {
			out, lg = []int32{int32(n - 1)}, logits
		}
		if err := r.c.Forward(toks[:n], r.bb.Batch(), out, lg); err != nil {
			t.Fatal(err)
		}
		if err := r.seq.Advance(n); err != nil {
			t.Fatal(err)
		}
		toks = toks[n:]
	}
}

func TestParityWithLlamaCpp(t *testing.T) {
	shared := sharedtest.Dir(t)
	for _, be := range backendsUnderTest(t) {
		for _, pc := range parityCases {
			t.Run(be.Name()+"/"+strings.TrimSuffix(pc.model, ".gguf"), func(t *testing.T) {
				f, err := gguf.Open(filepath.Join(shared, "models/llm", pc.model))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				raw, err := os.ReadFile(filepath.Join(shared, "reference/llm", pc.ref))
				if err != nil {
					t.Fatal(err)
				}
				var ref refGen
				if err := json.Unmarshal(raw, &ref); err != nil {
					t.Fatal(err)
				}
				m, err := llama.Load(f, be)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				// Prompt chunks of at most 16 tokens: the prompts of 28 and 24 tokens continue over
				// two chunks, and chunks of more than eight rows and of fewer both occur (the CUDA
				// backend's matrix-vector and batched products).
				c, err := m.NewContext(llama.ContextConfig{StepTokens: 16, MaxSeqs: 1, KVSlots: 512, KVType: kvTypeUnderTest})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				logits := make([]float32, m.Vocab)
				lp := make([]float64, m.Vocab)
				var diffs []float64
				for _, res := range ref.Results {
					r := &runner{c: c, seq: c.Pool().NewSeq(512)}
					r.feed(t, res.PromptTokens, logits)
					for si, st := range res.Steps {
						logSoftmax(logits, lp)
						for _, e := range st.Top5 {
							diffs = append(diffs, math.Abs(lp[e.ID]-e.Logprob))
						}
						if got := argmax(logits); got != st.ID {
							margin := st.Top5[0].Logprob - st.Top5[1].Logprob
							if margin > pc.nearTie {
								t.Errorf("%s step %d: greedy id %d, llama.cpp %d (reference margin %.3g)", res.PromptID, si, got, st.ID, margin)
							} else {
								t.Logf("%s step %d: greedy id %d vs llama.cpp %d at a near tie (margin %.3g)", res.PromptID, si, got, st.ID, margin)
							}
						}
						// Teacher-force the reference's token.
						r.feed(t, []int32{st.ID}, logits)
					}
					r.seq.Release()
				}
				sort.Float64s(diffs)
				med, p99, mx := diffs[len(diffs)/2], diffs[len(diffs)*99/100], diffs[len(diffs)-1]
				t.Logf("|logprob - llama.cpp| over %d top-5 values: median %.2g, p99 %.2g, max %.2g", len(diffs), med, p99, mx)
				if med > pc.median || mx > pc.maxDiff || math.IsNaN(mx) {
					t.Errorf("log-probabilities differ from llama.cpp: median %.2g (bound %.2g), max %.2g (bound %.2g)", med, pc.median, mx, pc.maxDiff)
				}
			})
		}
	}
}

// kvTypeUnderTest is llama.cpp's default KV-cache type; PARLEY_TEST_KV=f32 tries F32.
var kvTypeUnderTest = func() tensor.DType {
	if os.Getenv("PARLEY_TEST_KV") == "f32" {
		return tensor.F32
	}
	return tensor.F16
}()
