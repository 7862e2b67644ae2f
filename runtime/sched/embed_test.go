package sched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakeEmbed embeds a sequence as (its length, the sum of its tokens, its first token), and
// records the sequences of every step.
type fakeEmbed struct {
	step, most int
	mu         sync.Mutex
	steps      [][]int
	delay      time.Duration
}

func (f *fakeEmbed) Dim() int        { return 3 }
func (f *fakeEmbed) StepTokens() int { return f.step }
func (f *fakeEmbed) MaxTokens() int  { return f.most }
func (f *fakeEmbed) Embed(tokens []int32, lens []int, out []float32) error {
	time.Sleep(f.delay)
	f.mu.Lock()
	f.steps = append(f.steps, append([]int(nil), lens...))
	f.mu.Unlock()
	n := 0
	for _, l := range lens {
		n += l
	}
	if n > f.step || len(tokens) != n || len(out) != 3*len(lens) {
		return fmt.Errorf("fake: %d tokens in %v, %d outputs", len(tokens), lens, len(out))
	}
	for s, l := range lens {
		var sum float32
		for _, t := range tokens[:l] {
			sum += float32(t)
		}
		out[3*s], out[3*s+1], out[3*s+2] = float32(l), sum, float32(tokens[0])
		tokens = tokens[l:]
	}
	return nil
}

func runEmbedder(t *testing.T, f *fakeEmbed) *Embedder {
	t.Helper()
	e, err := NewEmbedder(f, EmbedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- e.Run(context.Background()) }()
	t.Cleanup(func() {
		e.Close()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return e
}

// TestEmbedderBatches: many concurrent requests of several inputs each get their own
// embeddings, in order, while steps pack inputs of several requests and never exceed the step.
func TestEmbedderBatches(t *testing.T) {
	f := &fakeEmbed{step: 64, most: 20, delay: 2 * time.Millisecond}
	e := runEmbedder(t, f)
	const reqs = 24
	var wg sync.WaitGroup
	for r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var in [][]int32
			for i := range 1 + r%5 {
				l := 1 + (r*7+i*3)%20
				x := make([]int32, l)
				for k := range x {
					x[k] = int32(r*100 + i*10 + k)
				}
				in = append(in, x)
			}
			got, err := e.Embed(context.Background(), in)
			if err != nil {
				t.Error(err)
				return
			}
			for i, x := range in {
				var sum float32
				for _, v := range x {
					sum += float32(v)
				}
				if v := got[i]; len(v) != 3 || v[0] != float32(len(x)) || v[1] != sum || v[2] != float32(x[0]) {
					t.Errorf("request %d input %d: %v", r, i, v)
				}
			}
		}()
	}
	wg.Wait()
	shared := false
	for _, s := range f.steps {
		n := 0
		for _, l := range s {
			n += l
		}
		if n > f.step {
			t.Errorf("step %v of %d tokens", s, n)
		}
		shared = shared || len(s) > 5 // more inputs than one request has
	}
	if !shared {
		t.Errorf("no step held inputs of several requests: %v", f.steps)
	}
}

// TestEmbedderErrors: bad inputs are ErrInvalid; a cancelled request returns its context's error.
func TestEmbedderErrors(t *testing.T) {
	f := &fakeEmbed{step: 16, most: 8, delay: 20 * time.Millisecond}
	e := runEmbedder(t, f)
	for _, in := range [][][]int32{nil, {{}}, {{1}, make([]int32, 9)}} {
		if _, err := e.Embed(context.Background(), in); !errors.Is(err, ErrInvalid) {
			t.Errorf("%d inputs: %v, want ErrInvalid", len(in), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	many := make([][]int32, 50)
	for i := range many {
		many[i] = []int32{1, 2, 3, 4, 5, 6, 7, 8}
	}
	if _, err := e.Embed(ctx, many); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled: %v", err)
	}
	if v, err := e.Embed(context.Background(), [][]int32{{4, 5}}); err != nil || v[0][1] != 9 {
		t.Errorf("after a cancelled request: %v %v", v, err)
	}
}
