package sched

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
)

// fakeVocab is the fake model's vocabulary; token 0 is its only end-of-generation token.
const fakeVocab = 64

// fakeModel is a deterministic Model whose cache holds the tokens themselves: the logits after
// position pos are a function of pos and of the sum of the tokens the sequence's cache holds at
// positions 0..pos, read through the batch's block table. Any mistake in block sharing, slots or
// positions therefore changes the output.
type fakeModel struct {
	pool       *kvcache.Pool
	kv         []int32 // [slots] token stored in each slot
	stepTokens int
	maxSeqs    int
	eosAt      int // if > 0, EOS is the most likely token at this position
	record     bool
	calls      int
	batches    []int   // tokens of each Forward
	rows       []int   // logit rows of each Forward
	starts     []int32 // first prompt token of every sequence fed from position 0, in order
	hook       func(call int)
	fail       error // returned by the next Forward, then cleared
}

func newFake(t testing.TB, blocks, blockSize, stepTokens, maxSeqs int) *fakeModel {
	p, err := kvcache.NewPool(blocks, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeModel{pool: p, kv: make([]int32, p.Slots()), stepTokens: stepTokens, maxSeqs: maxSeqs, record: true}
}

func (f *fakeModel) Pool() *kvcache.Pool { return f.pool }
func (f *fakeModel) Vocab() int          { return fakeVocab }
func (f *fakeModel) StepTokens() int     { return f.stepTokens }
func (f *fakeModel) MaxSeqs() int        { return f.maxSeqs }

// fill writes the logits ([fakeVocab]) that follow position pos of a sequence whose tokens sum to sum.
func (f *fakeModel) fill(row []float32, sum int64, pos int) {
	row[0] = -100
	if f.eosAt > 0 && pos+1 == f.eosAt {
		row[0] = 100
	}
	for k := 1; k < fakeVocab; k++ {
		row[k] = -0.05 * float32((sum*31+int64(pos)*7+int64(k)*13)%(fakeVocab-1))
	}
}

func (f *fakeModel) Forward(tokens []int32, b *backend.Batch, out []int32, logits []float32) error {
	f.calls++
	if f.hook != nil {
		f.hook(f.calls)
	}
	if err := f.fail; err != nil {
		f.fail = nil
		return err
	}
	n := len(tokens)
	if n == 0 || n > f.stepTokens || len(out) > f.maxSeqs || len(logits) != len(out)*fakeVocab || len(b.Pos) != n || len(b.Slot) != n {
		return fmt.Errorf("fake: bad step: %d tokens, %d rows, %d logits", n, len(out), len(logits))
	}
	bs := f.pool.BlockSize()
	for _, s := range b.Seqs {
		for k := range s.Count {
			i := s.Start + k
			pos := s.CtxLen - s.Count + k
			if int(b.Pos[i]) != pos || b.Slot[i] != s.Blocks[pos/bs]*int32(bs)+int32(pos%bs) {
				return fmt.Errorf("fake: token %d at position %d slot %d, want %d", i, b.Pos[i], b.Slot[i], pos)
			}
			if pos == 0 && f.record {
				f.starts = append(f.starts, tokens[i])
			}
		}
	}
	for i, t := range tokens {
		if t < 0 || t >= fakeVocab {
			return fmt.Errorf("fake: token %d", t)
		}
		f.kv[b.Slot[i]] = t
	}
	for r, i := range out {
		var seq *backend.Seq
		for j := range b.Seqs {
			if s := &b.Seqs[j]; int(i) >= s.Start && int(i) < s.Start+s.Count {
				seq = s
			}
		}
		pos := int(b.Pos[i])
		var sum int64
		for j := 0; j <= pos; j++ {
			sum += int64(f.kv[seq.Blocks[j/bs]*int32(bs)+int32(j%bs)])
		}
		f.fill(logits[r*fakeVocab:(r+1)*fakeVocab], sum, pos)
	}
	if f.record {
		f.batches = append(f.batches, n)
		f.rows = append(f.rows, len(out))
	}
	return nil
}

// reference generates what one sequence of the fake model produces for prompt with sampler params
// p (seed included): its tokens (an end-of-generation token excluded) and stop reason.
func (f *fakeModel) reference(t testing.TB, prompt []int32, maxTokens int, p decode.Params) ([]int32, decode.StopReason) {
	smp, err := decode.NewSampler(p, fakeVocab)
	if err != nil {
		t.Fatal(err)
	}
	if err := smp.AcceptPrompt(prompt); err != nil {
		t.Fatal(err)
	}
	toks := slices.Clone(prompt)
	var gen []int32
	row := make([]float32, fakeVocab)
	for len(gen) < maxTokens {
		var sum int64
		for _, x := range toks {
			sum += int64(x)
		}
		f.fill(row, sum, len(toks)-1)
		id, err := smp.Sample(row)
		if err != nil {
			t.Fatal(err)
		}
		smp.Accept(id)
		if id == 0 {
			return gen, decode.StopEOS
		}
		gen = append(gen, id)
		toks = append(toks, id)
	}
	return gen, decode.StopLength
}

// fakeText spells token k as one letter; token 0 is the end-of-generation token.
type fakeText struct{}

var letters = func() [fakeVocab][]byte {
	var p [fakeVocab][]byte
	p[0] = []byte("</s>")
	for k := 1; k < fakeVocab; k++ {
		p[k] = []byte{byte('a' + k%26)}
	}
	return p
}()

func (fakeText) Piece(id int32) []byte { return letters[id] }
func (fakeText) IsEOG(id int32) bool   { return id == 0 }

func spell(toks []int32) string {
	var b []byte
	for _, t := range toks {
		b = append(b, letters[t]...)
	}
	return string(b)
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type harness struct {
	s    *Scheduler
	m    *fakeModel
	errc chan error
}

// newHarness makes a scheduler over m; run starts its loop. Cleanup closes it, checks that Run
// returned nil, that every block is free, and that no goroutine is left behind.
func newHarness(t *testing.T, m *fakeModel, cfg Config) *harness {
	t.Helper()
	return newHarnessOf(t, m, m, cfg)
}

// newHarnessOf is newHarness for a model built on m (a Picker over it).
func newHarnessOf(t *testing.T, model Model, m *fakeModel, cfg Config) *harness {
	t.Helper()
	base := runtime.NumGoroutine()
	s, err := New(model, fakeText{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{s: s, m: m}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if h.errc != nil {
			if err := <-h.errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
		if free := m.pool.FreeBlocks(); free != m.pool.Blocks() {
			t.Errorf("%d of %d blocks free after Close", free, m.pool.Blocks())
		}
		// Goroutines that are ending (Run's wrapper, context watches) get up to 10 s.
		for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > base && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > base {
			t.Errorf("%d goroutines after Close, %d before", n, base)
		}
	})
	return h
}

func (h *harness) run() {
	h.errc = make(chan error, 1)
	go func() { h.errc <- h.s.Run(context.Background()) }()
}

func (h *harness) submit(t *testing.T, r *Request) *Stream {
	t.Helper()
	st, err := h.s.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// seqResult is what one sequence of a stream produced.
type seqResult struct {
	tokens []int32
	text   string
	reason decode.StopReason
	err    error
	events int
}

// drain reads st to the end and checks the event protocol: one Done per sequence, last.
func drain(t *testing.T, st *Stream, n int) []seqResult {
	t.Helper()
	return drainWith(t, st, n, nil)
}

// drainWith is drain, handing prompt events (Request.PromptLogprobs) to prompt with whether an
// event of another kind came before; without prompt, a prompt event is a failure.
func drainWith(t *testing.T, st *Stream, n int, prompt func(ev Event, afterOther bool)) []seqResult {
	t.Helper()
	res := make([]seqResult, n)
	done := make([]bool, n)
	other := false
	for ev := range st.Events() {
		if ev.Seq < 0 || ev.Seq >= n {
			t.Fatalf("event for sequence %d of %d", ev.Seq, n)
		}
		if ev.Prompt {
			if prompt == nil {
				t.Fatalf("prompt event %+v from a request that did not ask for them", ev)
			}
			prompt(ev, other)
			continue
		}
		other = true
		r := &res[ev.Seq]
		if done[ev.Seq] {
			t.Fatalf("sequence %d: event after Done", ev.Seq)
		}
		r.events++
		if ev.Token >= 0 {
			r.tokens = append(r.tokens, ev.Token)
		}
		r.text += string(ev.Text)
		if ev.Done {
			done[ev.Seq] = true
			r.reason, r.err = ev.Reason, ev.Err
		}
	}
	for i, d := range done {
		if !d {
			t.Fatalf("sequence %d: stream closed without Done", i)
		}
	}
	return res
}

func greedy() decode.Params {
	p := decode.DefaultParams()
	p.Temperature = 0
	return p
}

func prompt(first int32, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = 1 + (first+int32(i)*5)%(fakeVocab-1)
	}
	p[0] = first
	return p
}

func checkSeq(t *testing.T, m *fakeModel, got seqResult, p []int32, maxTokens int, sp decode.Params) {
	t.Helper()
	want, reason := m.reference(t, p, maxTokens, sp)
	if !slices.Equal(got.tokens, want) || got.reason != reason || got.text != spell(want) {
		t.Fatalf("prompt %v: got %v %q (%s), want %v %q (%s)", p, got.tokens, got.text, got.reason, want, spell(want), reason)
	}
}

var errBoom = errors.New("boom")
