// Package kvcache manages the slots of a model's key/value cache: one shared pool of fixed-size
// blocks from which every sequence takes what it needs, so that many sequences of different
// lengths share one backend.KV without fragmentation. It only does the bookkeeping (which blocks a
// sequence owns, how many positions it holds); the keys and values themselves live in the
// backend's KV and are written by the model.
//
// Blocks are reference-counted so that sequences may share a prompt prefix: Fork gives a new
// sequence the blocks of an existing one (full blocks shared, the partial last one too until one
// of them writes past the shared length: see Fork).
package kvcache

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
)

// ErrFull is returned when the pool has too few free blocks for a request.
var ErrFull = errors.New("kvcache: out of KV-cache blocks")

// Pool is a set of nBlocks blocks of blockSize slots each. It is not safe for concurrent use: the
// scheduler that steps sequences owns it.
type Pool struct {
	blockSize int
	free      []int32 // stack of free block ids
	refs      []int32 // [nBlocks] number of sequences holding each block
}

// NewPool makes a pool of nBlocks blocks of blockSize slots.
func NewPool(nBlocks, blockSize int) (*Pool, error) {
	if nBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("kvcache: invalid pool of %d blocks of %d slots", nBlocks, blockSize)
	}
	if int64(nBlocks)*int64(blockSize) > 1<<31-1 {
		return nil, fmt.Errorf("kvcache: %d blocks of %d slots is too many slots", nBlocks, blockSize)
	}
	p := &Pool{blockSize: blockSize, free: make([]int32, nBlocks), refs: make([]int32, nBlocks)}
	for i := range p.free {
		p.free[i] = int32(nBlocks - 1 - i) // pop order 0, 1, 2, ...
	}
	return p, nil
}

// BlockSize is the number of slots in a block.
func (p *Pool) BlockSize() int { return p.blockSize }

// Blocks is the total number of blocks.
func (p *Pool) Blocks() int { return len(p.refs) }

// FreeBlocks is the number of blocks no sequence holds.
func (p *Pool) FreeBlocks() int { return len(p.free) }

// Slots is the total number of slots (the size of the backend.KV to make).
func (p *Pool) Slots() int { return len(p.refs) * p.blockSize }

// BlocksFor is the number of blocks n positions take.
func (p *Pool) BlocksFor(n int) int { return (n + p.blockSize - 1) / p.blockSize }

func (p *Pool) take() int32 {
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.refs[b] = 1
	return b
}

func (p *Pool) drop(b int32) {
	p.refs[b]--
	if p.refs[b] == 0 {
		p.free = append(p.free, b)
	}
}

// Seq is one sequence's share of the cache: its block table and the number of positions whose
// keys and values are stored.
type Seq struct {
	pool   *Pool
	blocks []int32
	n      int
}

// NewSeq makes an empty sequence. capacity is a hint (positions) for the block table's size.
func (p *Pool) NewSeq(capacity int) *Seq {
	return &Seq{pool: p, blocks: make([]int32, 0, p.BlocksFor(capacity))}
}

// Len is the number of positions stored.
func (s *Seq) Len() int { return s.n }

// Blocks is the block table (owned by s; valid until the next Reserve, Truncate or Release).
func (s *Seq) Blocks() []int32 { return s.blocks }

// Reserve makes room for k more positions, taking blocks from the pool as needed. It takes all
// or nothing: on ErrFull the sequence is unchanged.
func (s *Seq) Reserve(k int) error {
	if k < 0 {
		return fmt.Errorf("kvcache: negative reservation %d", k)
	}
	need := s.pool.BlocksFor(s.n+k) - len(s.blocks)
	if need <= 0 {
		return nil
	}
	if need > len(s.pool.free) {
		return fmt.Errorf("%w: need %d more blocks, %d free", ErrFull, need, len(s.pool.free))
	}
	for ; need > 0; need-- {
		s.blocks = append(s.blocks, s.pool.take())
	}
	return nil
}

// Advance records that k more positions (reserved before) now hold keys and values.
func (s *Seq) Advance(k int) error {
	if k < 0 || s.n+k > len(s.blocks)*s.pool.blockSize {
		return fmt.Errorf("kvcache: advance by %d past the %d reserved positions", k, len(s.blocks)*s.pool.blockSize)
	}
	s.n += k
	return nil
}

// Slot returns the cache slot of position pos.
func (s *Seq) Slot(pos int) int32 {
	bs := s.pool.blockSize
	return s.blocks[pos/bs]*int32(bs) + int32(pos%bs)
}

// Truncate drops positions from n on, returning whole blocks no longer needed to the pool.
func (s *Seq) Truncate(n int) {
	if n < 0 {
		n = 0
	}
	if n >= s.n {
		return
	}
	s.n = n
	keep := s.pool.BlocksFor(n)
	for _, b := range s.blocks[keep:] {
		s.pool.drop(b)
	}
	s.blocks = s.blocks[:keep]
}

// Release returns all of the sequence's blocks to the pool, those reserved but not yet advanced
// into too. The sequence is empty afterwards and may be reused.
func (s *Seq) Release() {
	for _, b := range s.blocks {
		s.pool.drop(b)
	}
	s.blocks, s.n = s.blocks[:0], 0
}

// Shared reports whether the block holding position pos is also held by another sequence, in
// which case writing that position requires copying the block first.
func (s *Seq) Shared(pos int) bool {
	i := pos / s.pool.blockSize
	return i < len(s.blocks) && s.pool.refs[s.blocks[i]] > 1
}

// Fork returns a new sequence holding the first n positions of s by sharing its blocks (n is
// rounded down to a whole block, so that neither sequence writes into a block the other reads).
func (s *Seq) Fork(n int) *Seq {
	if n > s.n {
		n = s.n
	}
	full := n / s.pool.blockSize
	t := &Seq{pool: s.pool, blocks: make([]int32, full, cap(s.blocks)), n: full * s.pool.blockSize}
	copy(t.blocks, s.blocks[:full])
	for _, b := range t.blocks {
		s.pool.refs[b]++
	}
	return t
}

// ForkInto is Fork reusing dst (an empty sequence of the same pool, e.g. one just released) so
// that steady-state reordering of beams allocates nothing. It returns dst, or a new sequence when
// dst is nil or belongs to another pool.
func (s *Seq) ForkInto(dst *Seq, n int) *Seq {
	if dst == nil || dst.pool != s.pool {
		return s.Fork(n)
	}
	dst.Release()
	if n > s.n {
		n = s.n
	}
	full := n / s.pool.blockSize
	dst.blocks = append(dst.blocks[:0], s.blocks[:full]...)
	for _, b := range dst.blocks {
		s.pool.refs[b]++
	}
	dst.n = full * s.pool.blockSize
	return dst
}

// BatchBuilder assembles a backend.Batch for one forward step from the sequences taking part,
// reusing its slices so that a steady-state step allocates nothing.
type BatchBuilder struct {
	b backend.Batch
}

// Reset starts a new batch.
func (bb *BatchBuilder) Reset() {
	bb.b.Pos = bb.b.Pos[:0]
	bb.b.Slot = bb.b.Slot[:0]
	bb.b.Seqs = bb.b.Seqs[:0]
}

// Add appends count tokens of s at positions s.Len() .. s.Len()+count-1. The caller must have
// reserved room for them (Reserve) and calls s.Advance(count) after the step.
func (bb *BatchBuilder) Add(s *Seq, count int) error {
	if count <= 0 {
		return fmt.Errorf("kvcache: a sequence joins a batch with %d tokens", count)
	}
	if s.n+count > len(s.blocks)*s.pool.blockSize {
		return fmt.Errorf("kvcache: %d tokens at position %d exceed the reserved %d positions", count, s.n, len(s.blocks)*s.pool.blockSize)
	}
	start := len(bb.b.Pos)
	for p := s.n; p < s.n+count; p++ {
		bb.b.Pos = append(bb.b.Pos, int32(p))
		bb.b.Slot = append(bb.b.Slot, s.Slot(p))
	}
	bb.b.Seqs = append(bb.b.Seqs, backend.Seq{Start: start, Count: count, CtxLen: s.n + count, Blocks: s.blocks})
	return nil
}

// Batch returns the batch built so far (valid until the next Reset).
func (bb *BatchBuilder) Batch() *backend.Batch { return &bb.b }

// Tokens is the number of tokens in the batch.
func (bb *BatchBuilder) Tokens() int { return len(bb.b.Pos) }

// Feed runs one step of several sequences through forward: toks[i] are the tokens of seqs[i]
// (none: seqs[i] sits the step out). It reserves room for them, builds the batch in bb, calls
// forward with the step's tokens in batch order, the batch, the batch row of each fed
// sequence's last token and the indices of the fed sequences, and advances them once forward
// succeeds. A convenience for callers that step a fixed set of sequences (tests, benchmarks);
// it allocates.
func Feed(bb *BatchBuilder, seqs []*Seq, toks [][]int32, forward func(all []int32, b *backend.Batch, last []int32, fed []int) error) error {
	if len(toks) != len(seqs) {
		return fmt.Errorf("kvcache: %d token lists for %d sequences", len(toks), len(seqs))
	}
	bb.Reset()
	var all, last []int32
	var fed []int
	for i, tk := range toks {
		if len(tk) == 0 {
			continue
		}
		if err := seqs[i].Reserve(len(tk)); err != nil {
			return err
		}
		if err := bb.Add(seqs[i], len(tk)); err != nil {
			return err
		}
		all = append(all, tk...)
		last = append(last, int32(len(all)-1))
		fed = append(fed, i)
	}
	if err := forward(all, bb.Batch(), last, fed); err != nil {
		return err
	}
	for _, i := range fed {
		if err := seqs[i].Advance(len(toks[i])); err != nil {
			return err
		}
	}
	return nil
}
