//go:build cuda && cgo && !nocgo

package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

var _ backend.GreedyTransducer = (*Backend)(nil)

// NewGreedyDecoding makes the device state of a greedy transducer decoding
// (backend.GreedyTransducer, native/cuda/tdt.cu).
func (b *Backend) NewGreedyDecoding(cfg backend.GreedyDecodingConfig) (backend.GreedyDecoding, error) {
	if cfg.Rows < 1 || cfg.Rows > 65535 || cfg.Blank < 0 || cfg.Blank > math.MaxInt32-bcuda.TDTMaxDurations-1 || cfg.MaxSymbols < 1 ||
		cfg.Ring < 1 || cfg.Ring > 1<<20 || len(cfg.Durations) > bcuda.TDTMaxDurations {
		return nil, fmt.Errorf("cuda: greedy decoding: %d rows, blank %d, %d durations, max symbols %d, ring %d",
			cfg.Rows, cfg.Blank, len(cfg.Durations), cfg.MaxSymbols, cfg.Ring)
	}
	for i, d := range cfg.Durations {
		if d < 0 || d > 1<<30 {
			return nil, fmt.Errorf("cuda: greedy decoding: duration %d is %d", i, d)
		}
	}
	if b.ops.Closed() {
		return nil, errors.New("cuda: greedy decoding: backend closed")
	}
	n, ring := cfg.Rows, cfg.Ring
	size := bcuda.TDTStateBytes(n, ring)
	buf, err := b.ctx.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("cuda: greedy decoding: %w", err)
	}
	g := &greedyDecoding{b: b, buf: buf, n: n, ring: ring, blank: cfg.Blank,
		rule:  bcuda.TDTRule{NTok: int(cfg.Blank) + 1, MaxSymbols: cfg.MaxSymbols, Ring: ring, Durations: append([]int(nil), cfg.Durations...)},
		host:  make([]byte, size),
		refs:  make([]bcuda.Ref, n),
		rows:  make([]int, n),
		width: int(cfg.Blank) + 1 + len(cfg.Durations)}
	// Every row starts done: a row not started takes part in no decision.
	for i := range n {
		if err := b.ctx.TDTStart(g.ref(), n, ring, i, 0, 0, cfg.Blank, false); err != nil {
			buf.Close()
			return nil, err
		}
	}
	return g, nil
}

// greedyDecoding is a backend.GreedyDecoding: the state array of parley_cuda.h in one buffer.
type greedyDecoding struct {
	b       *Backend
	buf     *bcuda.Buffer
	n, ring int
	width   int
	blank   int32
	rule    bcuda.TDTRule
	host    []byte      // Read's copy of the state
	refs    []bcuda.Ref // Frames' tables
	rows    []int       // their rows
}

func (g *greedyDecoding) ref() bcuda.Ref { return bcuda.Ref{Buf: g.buf} }

func (g *greedyDecoding) Start(row, frames int) error {
	return g.b.ctx.TDTStart(g.ref(), g.n, g.ring, row, 0, frames, g.blank, frames > 0)
}

func (g *greedyDecoding) Resume(row, frame, frames int, tok int32, emit bool) error {
	if tok < 0 || tok > g.blank {
		return fmt.Errorf("cuda: greedy resume: token %d is outside 0..%d", tok, g.blank)
	}
	return g.b.ctx.TDTStart(g.ref(), g.n, g.ring, row, frame, frames, tok, emit)
}

func (g *greedyDecoding) Stop(row int) error {
	return g.b.ctx.TDTStart(g.ref(), g.n, g.ring, row, 0, 0, g.blank, false)
}

// rowsOf checks that t is an F32 tensor of the backend with a row for each decoding row.
func (g *greedyDecoding) rowsOf(op, what string, t backend.Tensor, out bool) (*Tensor, error) {
	var ct *Tensor
	var err error
	if out {
		ct, err = g.b.ops.Out(op, what, t)
	} else {
		ct, err = g.b.ops.F32(op, what, t)
	}
	if err != nil {
		return nil, err
	}
	if ct.rows != g.n {
		return nil, fmt.Errorf("cuda: %s: %s has %d rows, want %d", op, what, ct.rows, g.n)
	}
	return ct, nil
}

func (g *greedyDecoding) Decide(logits backend.Tensor) error {
	l, err := g.rowsOf("greedy decide", "logits", logits, false)
	if err != nil {
		return err
	}
	if l.cols != g.width {
		return fmt.Errorf("cuda: greedy decide: logits of %d columns, want %d", l.cols, g.width)
	}
	return g.b.ctx.TDTDecide(l.ref(), g.n, g.rule, g.ref())
}

func (g *greedyDecoding) Frames(dst backend.Tensor, enc []backend.Tensor) error {
	const op = "greedy frames"
	d, err := g.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	if len(enc) != g.n {
		return fmt.Errorf("cuda: %s: %d tables for %d rows", op, len(enc), g.n)
	}
	for i, t := range enc {
		e, err := g.b.ops.F32(op, "enc", t)
		if err != nil {
			return err
		}
		if e.cols != d.cols || e.rows < 1 {
			return fmt.Errorf("cuda: %s: table %d is [%d, %d], want [*, %d]", op, i, e.rows, e.cols, d.cols)
		}
		g.refs[i], g.rows[i] = e.ref(), e.rows
	}
	return g.b.ctx.TDTGather(d.ref(), g.refs, g.rows, bcuda.Ref{}, tensor.F32, 0, d.cols, g.ref(), g.n, g.ring, bcuda.TDTIdx)
}

func (g *greedyDecoding) Tokens(dst, table backend.Tensor) error {
	const op = "greedy tokens"
	d, err := g.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	t, err := g.b.ops.Tensor(op, "table", table)
	if err != nil {
		return err
	}
	if t.rows != int(g.blank)+1 || t.cols != d.cols {
		return fmt.Errorf("cuda: %s: table [%d, %d], want [%d, %d]", op, t.rows, t.cols, g.blank+1, d.cols)
	}
	if t.dt != tensor.F32 && t.dt != tensor.F16 {
		return fmt.Errorf("cuda: %s: table of %v: %w", op, t.dt, backend.ErrUnsupported)
	}
	return g.b.ctx.TDTGather(d.ref(), nil, nil, t.ref(), t.dt, t.rows, d.cols, g.ref(), g.n, g.ring, bcuda.TDTTok)
}

func (g *greedyDecoding) Keep(dst, src backend.Tensor) error {
	const op = "greedy keep"
	d, err := g.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	s, err := g.rowsOf(op, "src", src, false)
	if err != nil {
		return err
	}
	if s.cols != d.cols {
		return fmt.Errorf("cuda: %s: src of %d columns, dst of %d", op, s.cols, d.cols)
	}
	return g.b.ctx.TDTKeep(d.ref(), s.ref(), d.cols, g.ref(), g.n, g.ring)
}

func (g *greedyDecoding) Read(r *backend.GreedyReport) error {
	if err := g.b.ctx.Download(g.host, g.ref()); err != nil {
		return err
	}
	n, ring := g.n, g.ring
	grow := func(s []int32, k int) []int32 {
		if cap(s) < k {
			return make([]int32, k)
		}
		return s[:k]
	}
	growF := func(s []float32, k int) []float32 {
		if cap(s) < k {
			return make([]float32, k)
		}
		return s[:k]
	}
	growB := func(s []bool, k int) []bool {
		if cap(s) < k {
			return make([]bool, k)
		}
		return s[:k]
	}
	r.Count, r.Done, r.Failed = grow(r.Count, n), growB(r.Done, n), growB(r.Failed, n)
	r.At, r.Last, r.Emit = grow(r.At, n), grow(r.Last, n), growB(r.Emit, n)
	r.Token, r.Frame, r.DurIdx = grow(r.Token, n*ring), grow(r.Frame, n*ring), grow(r.DurIdx, n*ring)
	r.P, r.PLog = growF(r.P, n*ring), growF(r.PLog, n*ring)
	at := func(field, i int) uint32 { return binary.LittleEndian.Uint32(g.host[4*(field*n+i):]) }
	for i := range n {
		r.Count[i] = int32(at(bcuda.TDTCount, i))
		r.Done[i] = at(bcuda.TDTDone, i) != 0
		r.Failed[i] = at(bcuda.TDTBad, i) != 0
		r.At[i] = int32(at(bcuda.TDTFrame, i))
		r.Last[i] = int32(at(bcuda.TDTTok, i))
		r.Emit[i] = at(bcuda.TDTEmit, i) != 0
	}
	base := bcuda.TDTFields * n
	for k := range n * ring {
		r.Token[k] = int32(at(0, base+k))
		r.Frame[k] = int32(at(0, base+n*ring+k))
		r.DurIdx[k] = int32(at(0, base+2*n*ring+k))
		r.P[k] = math.Float32frombits(at(0, base+3*n*ring+k))
		r.PLog[k] = math.Float32frombits(at(0, base+4*n*ring+k))
	}
	return nil
}

func (g *greedyDecoding) Close() error { return g.buf.Close() }

// Downloads is how many times the backend has copied device memory to the host: a test's
// measure of the host reads a loop makes.
func (b *Backend) Downloads() (int64, error) { return b.ctx.Downloads() }
