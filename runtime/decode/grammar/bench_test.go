package grammar

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// benchSchema nests objects within arrays within objects, with enums, strings, numbers,
// optional properties and a bounded string.
const benchSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string"},
    "status": {"enum": ["active", "inactive", "pending"]},
    "owner": {
      "type": "object",
      "properties": {"email": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"}},
      "required": ["email"]
    },
    "items": {
      "type": "array",
      "items": {
        "type": "object",
        "properties": {
          "sku": {"type": "string", "maxLength": 12},
          "qty": {"type": "integer"},
          "price": {"type": "number"},
          "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
          "note": {"type": "string"}
        },
        "required": ["sku", "qty", "price"]
      }
    },
    "created": {"type": "string", "format": "date-time"}
  },
  "required": ["id", "name", "status", "items"]
}`

// benchTokens returns a token sequence the grammar allows: a seeded random walk through its
// masks (favouring structural tokens so that it finishes), as a model might produce.
func benchTokens(tb testing.TB, a *Automaton, v *Vocab, seed uint64, max int) []int32 {
	tb.Helper()
	m := a.NewMatcher()
	r := rand.New(rand.NewPCG(seed, 1))
	var out, ids, pref []int32
	for len(out) < max {
		mask, err := m.Mask()
		if err != nil {
			tb.Fatal(err)
		}
		ids = allowedIDs(mask, v.Size(), ids)
		id := int32(-1)
		if m.Complete() {
			id = v.eog[0]
		} else {
			pool := ids
			if r.IntN(3) > 0 {
				pref = pref[:0]
				for _, x := range ids {
					if structural(v.Piece(x)) {
						pref = append(pref, x)
					}
				}
				if len(pref) > 0 {
					pool = pref
				}
			}
			id = pool[r.IntN(len(pool))]
		}
		if err := m.Accept(id); err != nil {
			tb.Fatal(err)
		}
		out = append(out, id)
		if m.Ended() {
			break
		}
	}
	return out
}

// BenchmarkMask replays constrained generations of benchSchema and times every Mask call:
// "cold" compiles the schema and builds a new Automaton for each generation (a request with a
// schema not seen before: every state's transitions and mask are computed on first use);
// "warm" reuses one Automaton (a schema cached across requests). It reports the median, the
// 99th percentile and the mean of the per-token mask times, and allocations per generation.
func BenchmarkMask(b *testing.B) {
	for _, c := range []struct{ name, rel string }{{"vocab=32000", vocabLlama}, {"vocab=102400", vocabDeepseek}} {
		v := sharedVocab(b, c.rel)
		g, err := FromJSONSchema([]byte(benchSchema))
		if err != nil {
			b.Fatal(err)
		}
		a0, _ := NewAutomaton(g, v, 0)
		var seqs [][]int32
		for seed := uint64(1); seed <= 8; seed++ {
			seqs = append(seqs, benchTokens(b, a0, v, seed, 400))
		}
		for _, mode := range []string{"cold", "warm"} {
			b.Run(c.name+"/"+mode, func(b *testing.B) {
				var times []time.Duration
				warm := a0
				b.ReportAllocs()
				n := 0
				for b.Loop() {
					seq := seqs[n%len(seqs)]
					n++
					a := warm
					if mode == "cold" {
						g, err := FromJSONSchema([]byte(benchSchema))
						if err != nil {
							b.Fatal(err)
						}
						a, _ = NewAutomaton(g, v, 0)
					}
					m := a.NewMatcher()
					for _, id := range seq {
						t0 := time.Now()
						_, err := m.Mask()
						times = append(times, time.Since(t0))
						if err != nil {
							b.Fatal(err)
						}
						if err := m.Accept(id); err != nil {
							b.Fatal(err)
						}
					}
				}
				slices.Sort(times)
				var sum time.Duration
				for _, t := range times {
					sum += t
				}
				b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "median-ns/token")
				b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns/token")
				b.ReportMetric(float64(sum.Nanoseconds())/float64(len(times)), "mean-ns/token")
				b.ReportMetric(float64(len(times))/float64(n), "tokens/op")
			})
		}
	}
}

// BenchmarkCompile is the per-request cost before the first mask: schema to grammar, and
// an Automaton over the 32,000-token vocabulary.
func BenchmarkCompile(b *testing.B) {
	v := sharedVocab(b, vocabLlama)
	b.ReportAllocs()
	for b.Loop() {
		g, err := FromJSONSchema([]byte(benchSchema))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := NewAutomaton(g, v, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMaskAllocs checks that once the states a generation reaches are built, its steps (Mask,
// Accept, Complete) allocate nothing.
func TestMaskAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	v := sharedVocab(t, vocabLlama)
	g, err := FromJSONSchema([]byte(benchSchema))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := NewAutomaton(g, v, 0)
	seq := benchTokens(t, a, v, 3, 300)
	m := a.NewMatcher()
	replay := func() {
		m.Reset()
		for _, id := range seq {
			if _, err := m.Mask(); err != nil {
				t.Fatal(err)
			}
			m.Complete()
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	replay()
	if allocs := testing.AllocsPerRun(5, replay); allocs != 0 {
		t.Errorf("%v allocations per generation of %d tokens", allocs, len(seq))
	}
	// With no mask cache, masks go to the Matcher's own buffer: still no allocation.
	a2, _ := NewAutomaton(g, v, -1)
	m = a2.NewMatcher()
	replay()
	if allocs := testing.AllocsPerRun(5, replay); allocs != 0 {
		t.Errorf("without a mask cache: %v allocations per generation", allocs)
	}
}
