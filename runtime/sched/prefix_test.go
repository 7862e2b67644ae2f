package sched

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
)

func cat(ps ...[]int32) []int32 {
	var out []int32
	for _, p := range ps {
		out = append(out, p...)
	}
	return out
}

// runOne submits r, drains it and returns its sequences and the Forward batch sizes it caused.
func runOne(t *testing.T, h *harness, r *Request) ([]seqResult, []int) {
	t.Helper()
	before := len(h.m.batches)
	n := max(r.N, 1)
	res := drain(t, h.submit(t, r), n)
	return res, slices.Clone(h.m.batches[before:])
}

// TestPrefixReuse runs prompts one after another that share prefixes of various lengths with the
// first. Each must produce exactly what it produces with the cache off, process only the tokens
// past the shared whole blocks (at least one), and leave the cached blocks intact for the next.
func TestPrefixReuse(t *testing.T) {
	base := prompt(7, 14)
	cases := []struct {
		name string
		p    []int32
		hit  int
	}{
		{"first", base, 0},
		{"two whole blocks and a partial one", cat(base[:10], prompt(30, 5)), 8},
		{"same prompt: the last token is re-fed", base, 12},
		{"prompt of exactly three blocks", base[:12], 8},
		{"partial first block", cat(base[:3], prompt(31, 9)), 0},
		{"differs in the second block", cat(base[:5], prompt(32, 9)), 4},
		{"extends the first", cat(base, prompt(33, 7)), 12},
		{"one token", base[:1], 0},
	}
	const maxTokens = 6
	var want [][]int32
	{
		m := newFake(t, 32, 4, 16, 4)
		h := newHarness(t, m, Config{})
		h.run()
		for _, c := range cases {
			res, _ := runOne(t, h, &Request{Prompt: c.p, MaxTokens: maxTokens, Sampling: greedy()})
			want = append(want, res[0].tokens)
		}
	}
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{PrefixCache: true})
	h.run()
	var hits, fed uint64
	for i, c := range cases {
		res, batches := runOne(t, h, &Request{Prompt: c.p, MaxTokens: maxTokens, Sampling: greedy()})
		checkSeq(t, m, res[0], c.p, maxTokens, greedy())
		if !slices.Equal(res[0].tokens, want[i]) {
			t.Fatalf("%s: %v, with the cache off %v", c.name, res[0].tokens, want[i])
		}
		if batches[0] != len(c.p)-c.hit || len(batches) != maxTokens {
			t.Fatalf("%s: batches %v, want %d prompt tokens then %d decode steps", c.name, batches, len(c.p)-c.hit, maxTokens-1)
		}
		hits += uint64(c.hit)
		fed += uint64(len(c.p) - c.hit)
		st := h.s.Stats()
		if st.PrefixHitTokens != hits || st.PromptTokens != fed {
			t.Fatalf("%s: %d tokens hit, %d processed; want %d, %d", c.name, st.PrefixHitTokens, st.PromptTokens, hits, fed)
		}
	}
	// Whole prompt blocks in the trie: base (3), the second case (1 more), the partial first
	// block case (3), the second-block case (2), the extension (2).
	if st := h.s.Stats(); st.CachedBlocks != 11 || st.KVBlocksUsed != 11 {
		t.Fatalf("%d blocks cached, %d used; want 11", st.CachedBlocks, st.KVBlocksUsed)
	}
}

// TestPrefixEviction: cached blocks give way, least recently released first, to a request that
// needs them, which is admitted at once.
func TestPrefixEviction(t *testing.T) {
	m := newFake(t, 20, 4, 16, 4)
	h := newHarness(t, m, Config{PrefixCache: true})
	m.hook = func(int) { checkCache(t, h.s) }
	h.run()
	a, c, big := prompt(3, 8), prompt(5, 8), prompt(9, 60)
	step := func(p []int32, maxTokens, hit, cached int) {
		t.Helper()
		before := h.s.Stats().PrefixHitTokens
		res, _ := runOne(t, h, &Request{Prompt: p, MaxTokens: maxTokens, Sampling: greedy()})
		checkSeq(t, m, res[0], p, maxTokens, greedy())
		st := h.s.Stats()
		if got := int(st.PrefixHitTokens - before); got != hit || st.CachedBlocks != cached {
			t.Fatalf("prompt %d: %d tokens hit, %d blocks cached; want %d, %d", p[0], got, st.CachedBlocks, hit, cached)
		}
		if st.KVBlocksUsed != cached || st.IdleBlocks != cached {
			t.Fatalf("%d blocks used, %d cached, %d idle; want every cached block idle once nothing runs", st.KVBlocksUsed, st.CachedBlocks, st.IdleBlocks)
		}
	}
	step(a, 1, 0, 2)
	step(c, 1, 0, 4)
	step(big, 13, 0, 2+15) // 18 blocks: a's two (released first) are evicted
	step(c, 1, 4, 17)
	step(a, 1, 0, 19)
	step(prompt(11, 70), 11, 0, 17) // needs all 20 blocks
	step(prompt(11, 3), 1, 0, 17)   // nothing whole to share
	step(prompt(11, 9), 2, 8, 17)
}

// TestPrefixIdleBlocks: the cached blocks a running sequence shares are not idle (they cannot be
// freed for admission) until it ends.
func TestPrefixIdleBlocks(t *testing.T) {
	m := newFake(t, 32, 4, 16, 4)
	h := newHarness(t, m, Config{PrefixCache: true})
	h.run()
	base := prompt(3, 9) // two whole blocks cached, the last token fed again by a sharer
	runOne(t, h, &Request{Prompt: base, MaxTokens: 1, Sampling: greedy()})
	if st := h.s.Stats(); st.CachedBlocks != 2 || st.IdleBlocks != 2 || st.BlockSize != 4 {
		t.Fatalf("after one request: %d blocks of %d positions cached, %d idle; want 2 of 4, 2", st.CachedBlocks, st.BlockSize, st.IdleBlocks)
	}
	// Every step of a sequence that shares both blocks and caches a third publishes, at its end,
	// the blocks it pins as not idle.
	var pinned []int
	m.hook = func(int) {
		st := h.s.Stats()
		pinned = append(pinned, st.CachedBlocks-st.IdleBlocks)
	}
	runOne(t, h, &Request{Prompt: append(slices.Clone(base[:8]), prompt(7, 5)...), MaxTokens: 6, Sampling: greedy()})
	m.hook = nil
	if len(pinned) < 2 || slices.Max(pinned[1:]) != 3 {
		t.Fatalf("blocks pinned at each step: %v, want 3 after the first step", pinned)
	}
	if st := h.s.Stats(); st.CachedBlocks != 3 || st.IdleBlocks != 3 {
		t.Fatalf("after the sharer: %d blocks cached, %d idle; want 3, 3", st.CachedBlocks, st.IdleBlocks)
	}
}

// TestPrefixTwiceAtOnce: two requests with the same prompt admitted in the same step both compute
// it; the cache keeps one copy and a third request shares it.
func TestPrefixTwiceAtOnce(t *testing.T) {
	m := newFake(t, 32, 4, 32, 4)
	h := newHarness(t, m, Config{PrefixCache: true})
	p := prompt(13, 10)
	a := h.submit(t, &Request{Prompt: p, MaxTokens: 4, Sampling: greedy()})
	b := h.submit(t, &Request{Prompt: p, MaxTokens: 4, Sampling: greedy()})
	h.run()
	checkSeq(t, m, drain(t, a, 1)[0], p, 4, greedy())
	checkSeq(t, m, drain(t, b, 1)[0], p, 4, greedy())
	if st := h.s.Stats(); st.CachedBlocks != 2 || st.PrefixHitTokens != 0 || st.KVBlocksUsed != 2 {
		t.Fatalf("stats %+v", st)
	}
	res, batches := runOne(t, h, &Request{Prompt: p, MaxTokens: 4, Sampling: greedy()})
	checkSeq(t, m, res[0], p, 4, greedy())
	if batches[0] != 2 {
		t.Fatalf("batches %v, want 2 prompt tokens first", batches)
	}
}

// TestPrefixN: N sequences of a request whose prompt is partly cached fork the shared blocks too;
// each matches the reference with its own seed.
func TestPrefixN(t *testing.T) {
	m := newFake(t, 64, 4, 32, 8)
	h := newHarness(t, m, Config{PrefixCache: true})
	h.run()
	base := prompt(7, 9)
	runOne(t, h, &Request{Prompt: base, MaxTokens: 3, Sampling: greedy()})
	p := cat(base, prompt(40, 9)) // 18 tokens: 8 cached, fork at 16
	sp := decode.DefaultParams()
	sp.Temperature = 1.5
	sp.TopK = 0
	sp.MinP = 0
	sp.Seed = 9
	before := h.s.Stats()
	res, _ := runOne(t, h, &Request{Prompt: p, MaxTokens: 12, N: 3, Sampling: sp})
	for i, r := range res {
		spi := sp
		spi.Seed = SeqSeed(sp.Seed, i)
		checkSeq(t, m, r, p, 12, spi)
	}
	st := h.s.Stats()
	if hit, fed := st.PrefixHitTokens-before.PrefixHitTokens, st.PromptTokens-before.PromptTokens; hit != 8 || fed != 10+2*2 {
		t.Fatalf("%d tokens hit, %d processed; want 8, 14", hit, fed)
	}
	// And again: now all four whole blocks are cached.
	res, _ = runOne(t, h, &Request{Prompt: p, MaxTokens: 12, N: 2, Sampling: sp})
	for i, r := range res {
		spi := sp
		spi.Seed = SeqSeed(sp.Seed, i)
		checkSeq(t, m, r, p, 12, spi)
	}
	if st := h.s.Stats(); st.CachedBlocks != 4 {
		t.Fatalf("%d blocks cached, want 4", st.CachedBlocks)
	}
}

// TestPrefixConcurrent: many requests at once over a small pool, their prompts drawn from a few
// shared prefixes, some with N = 2, some cancelled; every finished sequence matches the
// reference, and Close leaves every block free (checked by the harness).
func TestPrefixConcurrent(t *testing.T) {
	m := newFake(t, 48, 4, 24, 12)
	m.record = false
	h := newHarness(t, m, Config{MaxQueue: 100, StepTokens: 20, PrefixCache: true})
	m.hook = func(int) { checkCache(t, h.s) }
	h.run()
	heads := [][]int32{prompt(3, 13), prompt(4, 9), prompt(5, 17), prompt(6, 6)}
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for i := range 80 {
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		head := heads[rng.IntN(len(heads))]
		p := cat(head[:rng.IntN(len(head)+1)], prompt(int32(1+rng.IntN(60)), 1+rng.IntN(6)))
		n := 1 + rng.IntN(2)
		maxTokens := 1 + rng.IntN(12)
		cancel := i%9 == 4
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp := decode.DefaultParams()
			sp.Seed = uint64(i)
			st, err := h.s.Submit(context.Background(), &Request{Prompt: p, MaxTokens: maxTokens, N: n, Sampling: sp})
			if err != nil {
				errs <- err
				return
			}
			got := make([][]int32, n)
			reasons := make([]decode.StopReason, n)
			for ev := range st.Events() {
				if ev.Token >= 0 {
					got[ev.Seq] = append(got[ev.Seq], ev.Token)
				}
				if cancel {
					st.Cancel()
				}
				reasons[ev.Seq] = ev.Reason
			}
			for k := range n {
				if reasons[k] == ReasonCancelled {
					continue
				}
				spk := sp
				spk.Seed = SeqSeed(sp.Seed, k)
				want, wr := m.reference(t, p, maxTokens, spk)
				if !slices.Equal(got[k], want) || reasons[k] != wr {
					errs <- errors.New("output differs from the reference")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := h.s.Stats(); st.PrefixHitTokens == 0 || st.KVBlocksUsed != st.CachedBlocks || h.s.cache.evicted == 0 {
		t.Fatalf("stats %+v, %d blocks evicted", st, h.s.cache.evicted)
	}
	t.Logf("%d prompt tokens from the cache, %d processed, %d blocks evicted", h.s.Stats().PrefixHitTokens, h.s.Stats().PromptTokens, h.s.cache.evicted)
}

// TestOnStep: the hook sees every step that ran a forward pass, with its batch.
func TestOnStep(t *testing.T) {
	m := newFake(t, 64, 4, 16, 8)
	var mu sync.Mutex
	var tokens, seqs []int
	h := newHarness(t, m, Config{StepTokens: 6, OnStep: func(d time.Duration, s, n int) {
		mu.Lock()
		defer mu.Unlock()
		if d < 0 {
			t.Errorf("negative step duration %v", d)
		}
		tokens = append(tokens, n)
		seqs = append(seqs, s)
	}})
	// Both queued before the loop starts, so that they share steps however the test goroutine
	// is scheduled.
	a := h.submit(t, &Request{Prompt: prompt(1, 9), MaxTokens: 5, Sampling: greedy()})
	b := h.submit(t, &Request{Prompt: prompt(2, 4), MaxTokens: 7, Sampling: greedy(), N: 2})
	h.run()
	drain(t, a, 1)
	drain(t, b, 2)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(tokens, m.batches) || uint64(len(seqs)) != h.s.Stats().Steps {
		t.Fatalf("hook saw %v tokens, model %v", tokens, m.batches)
	}
	if slices.Max(seqs) != 3 || slices.Min(seqs) != 1 {
		t.Fatalf("sequences per step %v", seqs)
	}
}

// checkCache verifies the prefix cache's invariants: every leaf and only leaves hold a sequence
// covering their path; leaves below a node agree on its block, as does every running sequence
// pinning it; pins count those sequences; idle and the LRU heap match the unpinned nodes.
func checkCache(t *testing.T, s *Scheduler) {
	t.Helper()
	c := s.cache
	block := map[*node]int32{}
	idle, idleLeaves := 0, 0
	for key, n := range c.nodes {
		if n.key != key || n.depth != 0 && n.key.parent == nil {
			t.Fatalf("node at depth %d filed under the wrong key", n.depth)
		}
		if (len(n.kids) == 0) != (n.seq != nil) {
			t.Fatalf("node at depth %d: %d children, sequence %v", n.depth, len(n.kids), n.seq != nil)
		}
		if n.pins == 0 {
			idle++
			if len(n.kids) == 0 {
				idleLeaves++
				if n.at < 0 || c.lru[n.at] != n {
					t.Fatal("idle leaf missing from the LRU heap")
				}
			}
		} else if n.at >= 0 {
			t.Fatal("pinned node in the LRU heap")
		}
		if n.seq == nil {
			continue
		}
		if n.seq.Len() != (n.depth+1)*c.bs || len(n.seq.Blocks()) != n.depth+1 {
			t.Fatalf("leaf at depth %d holds %d positions", n.depth, n.seq.Len())
		}
		for a := n; a != nil; a = a.key.parent {
			b := n.seq.Blocks()[a.depth]
			if old, ok := block[a]; ok && old != b {
				t.Fatalf("leaves disagree on the block of a node at depth %d: %d, %d", a.depth, old, b)
			}
			block[a] = b
		}
	}
	if idle != c.idle || idleLeaves != len(c.lru) {
		t.Fatalf("%d idle nodes (%d leaves), counted %d (%d in the heap)", idle, idleLeaves, c.idle, len(c.lru))
	}
	pins := map[*node]int{}
	for _, q := range s.active {
		for a := q.pin; a != nil; a = a.key.parent {
			pins[a]++
			if q.kv.Blocks()[a.depth] != block[a] {
				t.Fatalf("a sequence pins a node at depth %d but holds another block there", a.depth)
			}
		}
	}
	for _, n := range c.nodes {
		if pins[n] > n.pins {
			t.Fatalf("node at depth %d: %d pins counted, %d active sequences", n.depth, n.pins, pins[n])
		}
	}
	if free := s.pool.FreeBlocks(); free+len(c.nodes) > s.pool.Blocks() {
		t.Fatalf("%d free blocks and %d cached of %d", free, len(c.nodes), s.pool.Blocks())
	}
}
