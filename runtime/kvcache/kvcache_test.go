package kvcache

import (
	"errors"
	"fmt"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
)

func TestReserveAdvanceSlots(t *testing.T) {
	p, err := NewPool(4, 3)
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSeq(0)
	if err := s.Reserve(5); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Blocks()); got != 2 || p.FreeBlocks() != 2 {
		t.Fatalf("after reserving 5 of block size 3: %d blocks held, %d free", got, p.FreeBlocks())
	}
	if err := s.Advance(5); err != nil {
		t.Fatal(err)
	}
	if err := s.Advance(2); err == nil {
		t.Fatal("advancing past the reservation succeeded")
	}
	for pos := 0; pos < 5; pos++ {
		want := s.Blocks()[pos/3]*3 + int32(pos%3)
		if got := s.Slot(pos); got != want {
			t.Errorf("slot(%d) = %d, want %d", pos, got, want)
		}
	}
	// All or nothing.
	if err := s.Reserve(100); !errors.Is(err, ErrFull) {
		t.Fatalf("oversized reservation: %v", err)
	}
	if len(s.Blocks()) != 2 || p.FreeBlocks() != 2 {
		t.Fatal("a failed reservation changed the sequence")
	}
	s.Truncate(3)
	if len(s.Blocks()) != 1 || p.FreeBlocks() != 3 || s.Len() != 3 {
		t.Fatalf("truncate to 3: %d blocks, %d free, len %d", len(s.Blocks()), p.FreeBlocks(), s.Len())
	}
	s.Release()
	if p.FreeBlocks() != 4 || s.Len() != 0 {
		t.Fatal("release did not return every block")
	}
}

func TestForkSharesWholeBlocks(t *testing.T) {
	p, _ := NewPool(8, 4)
	a := p.NewSeq(16)
	if err := a.Reserve(10); err != nil {
		t.Fatal(err)
	}
	_ = a.Advance(10)
	b := a.Fork(10)
	if b.Len() != 8 || len(b.Blocks()) != 2 {
		t.Fatalf("fork of 10 positions in blocks of 4: len %d, %d blocks; want 8, 2", b.Len(), len(b.Blocks()))
	}
	if !a.Shared(0) || !b.Shared(7) || a.Shared(9) {
		t.Fatal("sharing flags wrong")
	}
	free := p.FreeBlocks()
	a.Release()
	if p.FreeBlocks() != free+1 {
		t.Fatalf("releasing the parent freed %d blocks, want 1 (two still held by the fork)", p.FreeBlocks()-free)
	}
	b.Release()
	if p.FreeBlocks() != 8 {
		t.Fatalf("%d free after releasing both, want 8", p.FreeBlocks())
	}
}

func TestBatchBuilder(t *testing.T) {
	p, _ := NewPool(16, 4)
	a, b := p.NewSeq(0), p.NewSeq(0)
	_ = a.Reserve(6)
	_ = a.Advance(6)
	_ = a.Reserve(1)
	_ = b.Reserve(3)
	var bb BatchBuilder
	for round := 0; round < 2; round++ {
		bb.Reset()
		if err := bb.Add(a, 1); err != nil {
			t.Fatal(err)
		}
		if err := bb.Add(b, 3); err != nil {
			t.Fatal(err)
		}
		bt := bb.Batch()
		if bb.Tokens() != 4 || len(bt.Seqs) != 2 {
			t.Fatalf("batch of %d tokens, %d seqs", bb.Tokens(), len(bt.Seqs))
		}
		wantPos := []int32{6, 0, 1, 2}
		for i, p := range wantPos {
			if bt.Pos[i] != p {
				t.Fatalf("pos %v, want %v", bt.Pos, wantPos)
			}
		}
		if bt.Slot[0] != a.Slot(6) || bt.Slot[3] != b.Slot(2) {
			t.Fatal("slots wrong")
		}
		if s := bt.Seqs[1]; s.Start != 1 || s.Count != 3 || s.CtxLen != 3 {
			t.Fatalf("second sequence %+v", s)
		}
	}
	if err := bb.Add(b, 5); err == nil {
		t.Fatal("adding unreserved tokens succeeded")
	}
	allocs := testing.AllocsPerRun(100, func() {
		bb.Reset()
		_ = bb.Add(a, 1)
		_ = bb.Add(b, 3)
	})
	if allocs != 0 {
		t.Fatalf("steady-state batch building allocates %v times", allocs)
	}
}

// TestForkIntoReusesSequence forks beams with block size 1 (exact sharing) into released
// sequences, as beam search reorders its hypotheses, and checks reference counts and that a
// steady-state fork allocates nothing.
func TestForkIntoReusesSequence(t *testing.T) {
	p, _ := NewPool(32, 1)
	a := p.NewSeq(16)
	if err := a.Reserve(5); err != nil {
		t.Fatal(err)
	}
	_ = a.Advance(5)
	b := p.NewSeq(16)
	b = a.ForkInto(b, a.Len())
	if b.Len() != 5 || !b.Shared(4) || p.FreeBlocks() != 27 {
		t.Fatalf("fork: len %d, shared %v, %d free; want 5, true, 27", b.Len(), b.Shared(4), p.FreeBlocks())
	}
	allocs := testing.AllocsPerRun(100, func() {
		b = a.ForkInto(b, 3)
	})
	if allocs != 0 || b.Len() != 3 || b.Shared(3) {
		t.Fatalf("ForkInto: %v allocs, len %d; want 0 allocs, len 3", allocs, b.Len())
	}
	a.Release()
	b.Release()
	if p.FreeBlocks() != 32 {
		t.Fatalf("%d free after releasing both, want 32", p.FreeBlocks())
	}
	q, _ := NewPool(4, 1)
	if c := a.ForkInto(q.NewSeq(0), 0); c.pool != p {
		t.Fatal("ForkInto with a sequence of another pool must make a sequence of the source's pool")
	}
}

// TestFeed: Feed batches the sequences that have tokens, hands forward their tokens in order, the
// row of each one's last token and their indices, and advances them only when forward succeeds.
func TestFeed(t *testing.T) {
	p, err := NewPool(8, 4)
	if err != nil {
		t.Fatal(err)
	}
	seqs := []*Seq{p.NewSeq(16), p.NewSeq(16), p.NewSeq(16)}
	var bb BatchBuilder
	toks := [][]int32{{1, 2, 3}, nil, {4, 5}}
	err = Feed(&bb, seqs, toks, func(all []int32, b *backend.Batch, last []int32, fed []int) error {
		if fmt.Sprint(all, last, fed, len(b.Pos), len(b.Seqs)) != "[1 2 3 4 5] [2 4] [0 2] 5 2" {
			t.Errorf("forward got %v %v %v, %d positions, %d sequences", all, last, fed, len(b.Pos), len(b.Seqs))
		}
		return nil
	})
	if err != nil || seqs[0].Len() != 3 || seqs[1].Len() != 0 || seqs[2].Len() != 2 {
		t.Fatalf("err %v, lengths %d %d %d", err, seqs[0].Len(), seqs[1].Len(), seqs[2].Len())
	}
	boom := errors.New("boom")
	if err := Feed(&bb, seqs, toks, func([]int32, *backend.Batch, []int32, []int) error { return boom }); err != boom || seqs[0].Len() != 3 {
		t.Fatalf("a failing forward: %v, length %d (want boom, 3: not advanced)", err, seqs[0].Len())
	}
	if err := Feed(&bb, seqs, toks[:2], nil); err == nil {
		t.Fatal("two token lists for three sequences: no error")
	}
}

// TestReleaseReserved: Release returns blocks that were reserved but never advanced into (a
// sequence whose first step failed or was cancelled) as well as the used ones.
func TestReleaseReserved(t *testing.T) {
	p, err := NewPool(4, 16)
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewSeq(0)
	if err := s.Reserve(40); err != nil {
		t.Fatal(err)
	}
	s.Release()
	if p.FreeBlocks() != 4 {
		t.Fatalf("%d of 4 blocks free after releasing a reservation", p.FreeBlocks())
	}
	if err := s.Reserve(20); err != nil {
		t.Fatal(err)
	}
	if err := s.Advance(20); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(30); err != nil { // 50 positions: a third block
		t.Fatal(err)
	}
	s.Release()
	if p.FreeBlocks() != 4 || s.Len() != 0 {
		t.Fatalf("%d of 4 blocks free, length %d after Release", p.FreeBlocks(), s.Len())
	}
}
