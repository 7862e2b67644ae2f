package sched

import (
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/decode"
)

// TestSeqSeeds: sequence 0 of a request samples with the request's seed itself (a one-sequence
// request reproduces it), and sequence 1 of seed 1 is not sequence 0 of seed 2, as it was when
// sequence i took seed+i.
func TestSeqSeeds(t *testing.T) {
	m := newFake(t, 64, 4, 32, 8)
	h := newHarness(t, m, Config{})
	h.run()
	sp := decode.DefaultParams()
	sp.Temperature = 1
	sp.TopK = 0
	sp.TopP = 1
	sp.MinP = 0
	p := prompt(7, 6)
	run := func(seed uint64, n int) []seqResult {
		s := sp
		s.Seed = seed
		return drain(t, h.submit(t, &Request{Prompt: p, MaxTokens: 30, N: n, IgnoreEOS: true, Sampling: s}), n)
	}
	one, two := run(1, 2), run(2, 1)
	if slices.Equal(one[1].tokens, two[0].tokens) {
		t.Fatalf("seed 1's sequence 1 is seed 2's sequence 0: %v", two[0].tokens)
	}
	if single := run(1, 1); !slices.Equal(single[0].tokens, one[0].tokens) {
		t.Fatalf("seed 1's sequence 0 %v differs from a one-sequence request with seed 1 %v", one[0].tokens, single[0].tokens)
	}
	if SeqSeed(1, 0) != 1 || SeqSeed(1, 1) == 2 || SeqSeed(1, 1) == SeqSeed(2, 1) || SeqSeed(0, 1) == SeqSeed(0, 2) {
		t.Fatalf("SeqSeed(1, 0..1) = %d, %d; SeqSeed(2, 1) = %d", SeqSeed(1, 0), SeqSeed(1, 1), SeqSeed(2, 1))
	}
}
