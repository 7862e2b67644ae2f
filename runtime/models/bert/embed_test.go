package bert_test

import (
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

func backendsUnderTest(t testing.TB) []backend.Backend { return sharedtest.Backends(t, 2) }

// testSeqs are sequences of different lengths, the longest filling the model's positions, the
// shortest one token; each starts with [CLS] (101) as the tokenizer's would.
var testSeqs = [][]int32{
	{101, 7, 180, 33, 102},
	{101},
	{101, 150, 150, 150, 9, 64, 17, 120, 199, 3, 104, 105, 106, 102},
	{101, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66,
		67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 102},
	{101, 102},
}

// embedAll runs seqs through one Embed call and returns the embeddings as rows.
func embedAll(t testing.TB, c *bert.Context, seqs [][]int32, norm pooling.Norm) [][]float32 {
	t.Helper()
	var toks []int32
	var lens []int
	for _, s := range seqs {
		toks = append(toks, s...)
		lens = append(lens, len(s))
	}
	dim := c.Model().Dim
	out := make([]float32, pooling.Count(c.Pooling(), lens)*dim)
	if err := c.Embed(toks, lens, norm, out); err != nil {
		t.Fatal(err)
	}
	rows := make([][]float32, len(out)/dim)
	for i := range rows {
		rows[i] = out[i*dim : (i+1)*dim]
	}
	return rows
}

// worstDiff is the largest |got - want| over every element of every row, and the smallest
// cosine similarity of a row with its reference.
func worstDiff(got [][]float32, want [][]float64) (diff, minCos float64) {
	minCos = 1
	for i := range want {
		var dot, gg, ww float64
		for j, w := range want[i] {
			g := float64(got[i][j])
			d := math.Abs(g - w)
			if d != d {
				return math.Inf(1), math.NaN()
			}
			diff = math.Max(diff, d)
			dot, gg, ww = dot+g*w, gg+g*g, ww+w*w
		}
		minCos = math.Min(minCos, dot/math.Sqrt(gg*ww))
	}
	return diff, minCos
}

// TestEmbedMatchesFloat64: sequences of lengths 1 to the model's 48 positions, embedded together
// in one batch, each as the float64 reference embeds it alone (attention stays within each
// sequence), on every backend and every weight type, with the file's CLS pooling and L2
// normalisation.
//
// Tolerance, on the normalised embeddings (elements about 1/8 in magnitude), the largest
// difference of any element:
//   - F32: 1e-6. F32 arithmetic in another order than float64's; seen: 6.4e-8 (go, cpu, and
//     cuda on its CPU emulation).
//   - F16, Q8_0 and Q4_0 weights, whose products first convert the activations to F16 or Q8_0
//     (in the reference as in the backends): 1e-4 for F16, 3e-4 for the others. A value within
//     an F32 rounding error of a rounding boundary of the narrow type may round the other way
//     and move one product by one step of that type; seen: F16 9.1e-7, Q8_0 and Q4_0 7.0e-8. The
//     bounds stay below what the conversion itself moves the embeddings (1.2e-3 for Q8_0), so a
//     backend that skipped it would fail.
func TestEmbedMatchesFloat64(t *testing.T) {
	tols := map[tensor.DType]float64{tensor.F32: 1e-6, tensor.F16: 1e-4, tensor.Q8_0: 3e-4, tensor.Q4_0: 3e-4}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0, tensor.Q4_0} {
		f := testModel(t, dt, nil)
		ref := newRef64(t, f)
		ref.actRound = true
		var want [][]float64
		for _, s := range testSeqs {
			want = append(want, ref.embed(s, pooling.CLS)...)
		}
		for _, be := range backendsUnderTest(t) {
			t.Run(dt.String()+"/"+be.Name(), func(t *testing.T) {
				_, c := newContext(t, f, be, bert.ContextConfig{StepTokens: 80})
				if c.Pooling() != pooling.CLS {
					t.Fatalf("pooling %v, want the file's cls", c.Pooling())
				}
				got := embedAll(t, c, testSeqs, pooling.NormEuclidean)
				diff, cos := worstDiff(got, want)
				t.Logf("largest difference %.2g, smallest cosine similarity 1-%.2g", diff, 1-cos)
				if !(diff <= tols[dt]) {
					t.Fatalf("embeddings differ from the float64 reference's by up to %g (tolerance %g)", diff, tols[dt])
				}
			})
		}
	}
}

// TestEmbedPoolings: every pooling a context may choose over the file's, F32 weights, against
// the float64 reference (tolerance as TestEmbedMatchesFloat64's F32), and Embed's normalisation
// equal to pooling.Normalize of its unnormalised output.
func TestEmbedPoolings(t *testing.T) {
	f := testModel(t, tensor.F32, nil)
	ref := newRef64(t, f)
	for _, be := range backendsUnderTest(t) {
		m, err := bert.Load(f, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for _, pool := range []pooling.Type{pooling.None, pooling.Mean, pooling.CLS, pooling.Last} {
			t.Run(pool.String()+"/"+be.Name(), func(t *testing.T) {
				c, err := m.NewContext(bert.ContextConfig{StepTokens: 80, Pooling: pool})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				var want [][]float64
				for _, s := range testSeqs {
					want = append(want, ref.embed(s, pool)...)
				}
				got := embedAll(t, c, testSeqs, pooling.NormEuclidean)
				if len(got) != len(want) {
					t.Fatalf("%d embeddings, want %d", len(got), len(want))
				}
				if diff, _ := worstDiff(got, want); !(diff <= 1e-6) {
					t.Fatalf("embeddings differ from the float64 reference's by up to %g", diff)
				}
				// Unnormalised, then normalised here: the same vectors.
				raw := embedAll(t, c, testSeqs, pooling.NormNone)
				for i, row := range raw {
					x := append([]float32(nil), row...)
					if err := pooling.Normalize(x, m.Dim, pooling.NormEuclidean); err != nil {
						t.Fatal(err)
					}
					for j := range x {
						if x[j] != got[i][j] {
							t.Fatalf("embedding %d: normalising after Embed gives %v at %d, Embed %v", i, x[j], j, got[i][j])
						}
					}
				}
			})
		}
	}
}

// TestEmbedBatchIndependent: a sequence's embedding does not depend on what it is batched with
// or where in the batch it lies, beyond float rounding (1e-6; the pure-Go backend gives a row the
// same arithmetic in any batch: bit for bit), and repeated calls give the same result.
func TestEmbedBatchIndependent(t *testing.T) {
	f := testModel(t, tensor.Q8_0, nil)
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			_, c := newContext(t, f, be, bert.ContextConfig{StepTokens: 80, Pooling: pooling.Mean})
			batched := embedAll(t, c, testSeqs, pooling.NormEuclidean)
			reversed := make([][]int32, len(testSeqs))
			for i, s := range testSeqs {
				reversed[len(testSeqs)-1-i] = s
			}
			rev := embedAll(t, c, reversed, pooling.NormEuclidean)
			for i, s := range testSeqs {
				alone := embedAll(t, c, [][]int32{s}, pooling.NormEuclidean)[0]
				for j := range alone {
					for _, other := range []float32{batched[i][j], rev[len(testSeqs)-1-i][j]} {
						d := math.Abs(float64(alone[j] - other))
						if be.Name() == "go" && d != 0 || d > 1e-6 {
							t.Fatalf("sequence %d, element %d: %v alone, %v in a batch", i, j, alone[j], other)
						}
					}
				}
			}
			again := embedAll(t, c, testSeqs, pooling.NormEuclidean)
			for i := range again {
				for j := range again[i] {
					if again[i][j] != batched[i][j] {
						t.Fatalf("a second call gives %v for embedding %d element %d, the first %v", again[i][j], i, j, batched[i][j])
					}
				}
			}
		})
	}
}

// TestEmbedAllocatesNothing: once a context has embedded a batch of a given shape, embedding
// another of that shape allocates nothing, on every backend.
func TestEmbedAllocatesNothing(t *testing.T) {
	f := testModel(t, tensor.Q8_0, nil)
	var toks []int32
	var lens []int
	for _, s := range testSeqs {
		toks = append(toks, s...)
		lens = append(lens, len(s))
	}
	for _, be := range backendsUnderTest(t) {
		m, err := bert.Load(f, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for _, pool := range []pooling.Type{pooling.CLS, pooling.Mean} {
			c, err := m.NewContext(bert.ContextConfig{StepTokens: 80, Pooling: pool})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			out := make([]float32, len(lens)*m.Dim)
			embed := func() {
				if err := c.Embed(toks, lens, pooling.NormEuclidean, out); err != nil {
					t.Fatal(err)
				}
			}
			embed()
			if a := testing.AllocsPerRun(5, embed); a != 0 {
				t.Errorf("%s, %v pooling: %v allocations a batch", be.Name(), pool, a)
			}
		}
	}
}
