package grammar

import (
	"sync"
	"testing"
)

// TestConcurrentMatchers steps Matchers of one Automaton from several goroutines at once (the
// race detector checks the shared caches), each replaying a generation and a clone of it taken
// half way, and checks they all reach the same end as a lone replay.
func TestConcurrentMatchers(t *testing.T) {
	v := sharedVocab(t, vocabLlama)
	g, err := FromJSONSchema([]byte(benchSchema))
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := NewAutomaton(g, v, 0)
	var seqs [][]int32
	for seed := uint64(1); seed <= 4; seed++ {
		seqs = append(seqs, benchTokens(t, ref, v, seed, 300))
	}
	a, _ := NewAutomaton(g, v, 1<<20) // a small mask cache, so that some masks go to buffers
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(seq []int32) {
			defer wg.Done()
			m := a.NewMatcher()
			var c *Matcher
			for i, id := range seq {
				if i == len(seq)/2 {
					c = m.Clone()
				}
				if _, err := m.Mask(); err != nil {
					errs <- err
					return
				}
				if err := m.Accept(id); err != nil {
					errs <- err
					return
				}
			}
			for _, id := range seq[len(seq)/2:] {
				if err := c.Accept(id); err != nil {
					errs <- err
					return
				}
			}
			if !m.Ended() || !c.Ended() {
				errs <- ErrDeadEnd
			}
		}(seqs[w%len(seqs)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
