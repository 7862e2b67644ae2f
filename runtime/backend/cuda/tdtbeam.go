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

var _ backend.BeamTransducer = (*Backend)(nil)

// NewBeamDecoding makes the device state of transducer beam searches (backend.BeamTransducer,
// native/cuda/tdtbeam.cu).
func (b *Backend) NewBeamDecoding(cfg backend.BeamDecodingConfig) (backend.BeamDecoding, error) {
	if cfg.Streams < 1 || cfg.Width < 1 || cfg.Width > backend.MaxBeamWidth || cfg.Streams*cfg.Width > 65535 || cfg.Blank < 0 ||
		cfg.Blank > math.MaxInt32-bcuda.TDTMaxDurations-1 || cfg.MaxSymbols < 1 || cfg.Nodes < 1 || cfg.Nodes > 1<<26 ||
		len(cfg.Durations) > bcuda.TDTMaxDurations {
		return nil, fmt.Errorf("cuda: beam decoding: %d streams of width %d, blank %d, %d durations, max symbols %d, %d nodes",
			cfg.Streams, cfg.Width, cfg.Blank, len(cfg.Durations), cfg.MaxSymbols, cfg.Nodes)
	}
	for i, d := range cfg.Durations {
		if d < 0 || d > 1<<30 {
			return nil, fmt.Errorf("cuda: beam decoding: duration %d is %d", i, d)
		}
	}
	if b.ops.Closed() {
		return nil, errors.New("cuda: beam decoding: backend closed")
	}
	n := cfg.Streams
	search := bcuda.TDTBeam{NTok: int(cfg.Blank) + 1, MaxSymbols: cfg.MaxSymbols, Width: cfg.Width, Cap: cfg.Nodes,
		LogSumExp: cfg.LogSumExp, Durations: append([]int(nil), cfg.Durations...)}
	size := bcuda.TDTBeamStateBytes(n, search)
	if size < 0 {
		return nil, fmt.Errorf("cuda: beam decoding: %d streams of %d nodes", n, cfg.Nodes)
	}
	buf, err := b.ctx.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("cuda: beam decoding: %w", err)
	}
	hyp, str, nodes := bcuda.TDTBeamLayout(n, cfg.Width)
	d := &beamDecoding{b: b, buf: buf, n: n, w: cfg.Width, blank: cfg.Blank, search: search, hypOff: hyp, strOff: str,
		nodeOff: nodes, width: int(cfg.Blank) + 1 + len(cfg.Durations),
		host:  make([]byte, nodes),
		nodes: make([]byte, cfg.Nodes*bcuda.TDTBNodeSize),
		refs:  make([]bcuda.Ref, n*cfg.Width),
		rows:  make([]int, n*cfg.Width)}
	for s := range n {
		if err := d.Stop(s); err != nil {
			buf.Close()
			return nil, err
		}
	}
	return d, nil
}

// beamDecoding is a backend.BeamDecoding: the state of parley_cuda.h in one buffer.
type beamDecoding struct {
	b                       *Backend
	buf                     *bcuda.Buffer
	n, w, width             int
	blank                   int32
	search                  bcuda.TDTBeam
	hypOff, strOff, nodeOff int
	host                    []byte      // Read's copy of the hypotheses and streams
	nodes                   []byte      // Result's copy of a stream's tokens
	refs                    []bcuda.Ref // Frames' tables, one a row
	rows                    []int
}

func (d *beamDecoding) ref() bcuda.Ref { return bcuda.Ref{Buf: d.buf} }

// hypRef is the hypothesis block, which the greedy gathers read as a state of n·w rows.
func (d *beamDecoding) hypRef() bcuda.Ref { return bcuda.Ref{Buf: d.buf, Off: d.hypOff} }

func (d *beamDecoding) Start(s, frames, width int) error {
	return d.b.ctx.TDTBeamStart(d.ref(), d.n, d.search, s, frames, width, d.blank)
}

func (d *beamDecoding) Stop(s int) error { return d.Start(s, 0, 1) }

// rowsOf checks that t is an F32 tensor of the backend with a row for each hypothesis.
func (d *beamDecoding) rowsOf(op, what string, t backend.Tensor, out bool) (*Tensor, error) {
	var ct *Tensor
	var err error
	if out {
		ct, err = d.b.ops.Out(op, what, t)
	} else {
		ct, err = d.b.ops.F32(op, what, t)
	}
	if err != nil {
		return nil, err
	}
	if ct.rows != d.n*d.w {
		return nil, fmt.Errorf("cuda: %s: %s has %d rows, want %d", op, what, ct.rows, d.n*d.w)
	}
	return ct, nil
}

func (d *beamDecoding) Tokens(dst, table backend.Tensor) error {
	const op = "beam tokens"
	o, err := d.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	t, err := d.b.ops.Tensor(op, "table", table)
	if err != nil {
		return err
	}
	if t.rows != int(d.blank)+1 || t.cols != o.cols {
		return fmt.Errorf("cuda: %s: table [%d, %d], want [%d, %d]", op, t.rows, t.cols, d.blank+1, o.cols)
	}
	if t.dt != tensor.F32 && t.dt != tensor.F16 {
		return fmt.Errorf("cuda: %s: table of %v: %w", op, t.dt, backend.ErrUnsupported)
	}
	return d.b.ctx.TDTGather(o.ref(), nil, nil, t.ref(), t.dt, t.rows, o.cols, d.hypRef(), d.n*d.w, 1, bcuda.TDTBHTok)
}

func (d *beamDecoding) Keep(dst, src backend.Tensor) error {
	const op = "beam keep"
	o, err := d.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	s, err := d.rowsOf(op, "src", src, false)
	if err != nil {
		return err
	}
	if s.cols != o.cols {
		return fmt.Errorf("cuda: %s: src of %d columns, dst of %d", op, s.cols, o.cols)
	}
	return d.b.ctx.TDTKeep(o.ref(), s.ref(), o.cols, d.hypRef(), d.n*d.w, 1)
}

func (d *beamDecoding) Frames(dst backend.Tensor, enc []backend.Tensor) error {
	const op = "beam frames"
	o, err := d.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	if len(enc) != d.n {
		return fmt.Errorf("cuda: %s: %d tables for %d streams", op, len(enc), d.n)
	}
	for s, t := range enc {
		e, err := d.b.ops.F32(op, "enc", t)
		if err != nil {
			return err
		}
		if e.cols != o.cols || e.rows < 1 {
			return fmt.Errorf("cuda: %s: table %d is [%d, %d], want [*, %d]", op, s, e.rows, e.cols, o.cols)
		}
		for j := range d.w {
			d.refs[s*d.w+j], d.rows[s*d.w+j] = e.ref(), e.rows
		}
	}
	return d.b.ctx.TDTGather(o.ref(), d.refs, d.rows, bcuda.Ref{}, tensor.F32, 0, o.cols, d.hypRef(), d.n*d.w, 1, bcuda.TDTBHIdx)
}

func (d *beamDecoding) Round(logits backend.Tensor) error {
	l, err := d.rowsOf("beam round", "logits", logits, false)
	if err != nil {
		return err
	}
	if l.cols != d.width {
		return fmt.Errorf("cuda: beam round: logits of %d columns, want %d", l.cols, d.width)
	}
	return d.b.ctx.TDTBeamRound(l.ref(), d.n, d.search, d.ref())
}

func (d *beamDecoding) Gather(dst, src backend.Tensor) error {
	const op = "beam gather"
	o, err := d.rowsOf(op, "dst", dst, true)
	if err != nil {
		return err
	}
	s, err := d.rowsOf(op, "src", src, false)
	if err != nil {
		return err
	}
	if s.cols != o.cols {
		return fmt.Errorf("cuda: %s: src of %d columns, dst of %d", op, s.cols, o.cols)
	}
	return d.b.ctx.TDTBeamGather(o.ref(), s.ref(), o.cols, d.ref(), d.n, d.search)
}

func (d *beamDecoding) Read(r *backend.BeamReport) error {
	if err := d.b.ctx.Download(d.host, d.ref()); err != nil {
		return err
	}
	n := d.n
	r.Done, r.Failed, r.Full = growBools(r.Done, n), growBools(r.Failed, n), growBools(r.Full, n)
	if cap(r.Rounds) < n {
		r.Rounds, r.Tokens, r.Score = make([]int32, n), make([]int32, n), make([]float64, n)
	}
	r.Rounds, r.Tokens, r.Score = r.Rounds[:n], r.Tokens[:n], r.Score[:n]
	for s := range n {
		bad := d.stream(bcuda.TDTBSBad, s)
		r.Done[s] = d.stream(bcuda.TDTBSDone, s) != 0
		r.Failed[s], r.Full[s] = bad == 1, bad == 2
		r.Rounds[s] = d.stream(bcuda.TDTBSRounds, s)
		row := s * d.w
		r.Score[s] = math.Float64frombits(binary.LittleEndian.Uint64(d.host[8*row:]))
		r.Tokens[s] = d.hyp(bcuda.TDTBHNTok, row)
	}
	return nil
}

func (d *beamDecoding) stream(field, s int) int32 {
	return int32(binary.LittleEndian.Uint32(d.host[d.strOff+4*(field*d.n+s):]))
}

func (d *beamDecoding) hyp(field, row int) int32 {
	return int32(binary.LittleEndian.Uint32(d.host[d.hypOff+4*(field*d.n*d.w+row):]))
}

// Result reads the tokens of stream s's best hypothesis as the last Read left them: the nodes
// the stream used, in one copy.
func (d *beamDecoding) Result(s int, r *backend.BeamResult) error {
	if s < 0 || s >= d.n {
		return fmt.Errorf("cuda: beam result: stream %d of %d", s, d.n)
	}
	if d.stream(bcuda.TDTBSDone, s) == 0 {
		return fmt.Errorf("cuda: beam result: stream %d is not done at the last read", s)
	}
	used := int(d.stream(bcuda.TDTBSNodes, s))
	row := s * d.w
	r.Score = math.Float64frombits(binary.LittleEndian.Uint64(d.host[8*row:]))
	nt := int(d.hyp(bcuda.TDTBHNTok, row))
	if used < 0 || used > d.search.Cap || nt < 0 || nt > used {
		return fmt.Errorf("cuda: beam result: stream %d: %d tokens in %d nodes", s, nt, used)
	}
	r.Token, r.Frame, r.DurIdx = growInts(r.Token, nt), growInts(r.Frame, nt), growInts(r.DurIdx, nt)
	r.P, r.PLog = growFloats(r.P, nt), growFloats(r.PLog, nt)
	if nt == 0 {
		return nil
	}
	buf := d.nodes[:used*bcuda.TDTBNodeSize]
	if err := d.b.ctx.Download(buf, bcuda.Ref{Buf: d.buf, Off: d.nodeOff + s*d.search.Cap*bcuda.TDTBNodeSize}); err != nil {
		return err
	}
	word := func(x, k int) uint32 { return binary.LittleEndian.Uint32(buf[x*bcuda.TDTBNodeSize+4*k:]) }
	x := int(d.hyp(bcuda.TDTBHNode, row))
	for i := nt - 1; i >= 0; i-- {
		if x < 0 || x >= used {
			return fmt.Errorf("cuda: beam result: stream %d: a broken token chain", s)
		}
		r.Token[i], r.Frame[i], r.DurIdx[i] = int32(word(x, 0)), int32(word(x, 1)), int32(word(x, 2))
		r.P[i], r.PLog[i] = math.Float32frombits(word(x, 4)), math.Float32frombits(word(x, 5))
		x = int(int32(word(x, 3)))
	}
	return nil
}

func (d *beamDecoding) Close() error { return d.buf.Close() }

func growBools(s []bool, k int) []bool {
	if cap(s) < k {
		return make([]bool, k)
	}
	return s[:k]
}

func growInts(s []int32, k int) []int32 {
	if cap(s) < k {
		return make([]int32, k)
	}
	return s[:k]
}

func growFloats(s []float32, k int) []float32 {
	if cap(s) < k {
		return make([]float32, k)
	}
	return s[:k]
}
