package backend

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Argument checks shared by the backends, so that all of them reject the same arguments with the
// same words: each returns a description of what is wrong with an operation's arguments (the
// operands' shapes, its parameters, the batch), or nil. Backends reach them through Operands,
// which resolves the operands first (ownership, liveness, dtype, writability), adds the
// backend's name and checks the overlaps an operation allows.
//
// They run on every call, so they stay cheap: none allocates (CheckAttention's scratch grows to
// the largest batch seen, and only then), and the only loops are over the ids, slots, positions,
// sequences and needed block-table entries that a call passes.

func shapeErr(op, what string, t Tensor, rows, cols int) error {
	return fmt.Errorf("%s: %s is [%d, %d], want [%d, %d]", op, what, t.Rows(), t.Cols(), rows, cols)
}

// positive reports whether v is finite and above 0.
func positive(v float32) bool { return v > 0 && !math.IsInf(float64(v), 1) }

// finite reports whether v is neither NaN nor infinite.
func finite(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

// checkEps: a normalisation's epsilon is finite and above 0.
func checkEps(op string, eps float32) error {
	if !positive(eps) {
		return fmt.Errorf("%s: eps %v, want a finite value above 0", op, eps)
	}
	return nil
}

// checkHeads: query heads that group over the kv heads, all of HeadDim > 0, NHead*HeadDim within
// int32.
func checkHeads(op string, a Attn) error {
	if a.NHead <= 0 || a.NKVHead <= 0 || a.HeadDim <= 0 || a.NHead%a.NKVHead != 0 || a.NHead > math.MaxInt32/a.HeadDim {
		return fmt.Errorf("%s: %d query heads over %d kv heads of %d", op, a.NHead, a.NKVHead, a.HeadDim)
	}
	return nil
}

// CheckSpan: n elements from row row0 are whole rows inside t (Write, Read).
func CheckSpan(op string, t Tensor, row0, n int) error {
	rows, cols := t.Rows(), t.Cols()
	if cols == 0 {
		if n != 0 || row0 < 0 || row0 > rows {
			return fmt.Errorf("%s: %d elements at row %d of a [%d, 0] tensor", op, n, row0, rows)
		}
		return nil
	}
	if n%cols != 0 {
		return fmt.Errorf("%s: %d elements is not a whole number of rows of %d", op, n, cols)
	}
	if row0 < 0 || row0 > rows || n/cols > rows-row0 {
		return fmt.Errorf("%s: rows [%d, %d) outside a tensor of %d rows", op, row0, row0+n/cols, rows)
	}
	return nil
}

// CheckView: rows row0 .. row0+rows-1 lie inside t.
func CheckView(t Tensor, row0, rows int) error {
	if row0 < 0 || rows < 0 || row0 > t.Rows() || rows > t.Rows()-row0 {
		return fmt.Errorf("view: rows [%d, %d+%d) outside a tensor of %d rows", row0, row0, rows, t.Rows())
	}
	return nil
}

// CheckGetRows: dst [len(ids), cols of table], every id a row of table.
func CheckGetRows(dst, table Tensor, ids []int32) error {
	const op = "get rows"
	if dst.Rows() != len(ids) || dst.Cols() != table.Cols() {
		return shapeErr(op, "dst", dst, len(ids), table.Cols())
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows() {
			return fmt.Errorf("%s: id %d at %d outside the table's %d rows", op, id, i, table.Rows())
		}
	}
	return nil
}

// CheckMatMul: x [n, k] and w [m, k], dst [n, m].
func CheckMatMul(dst, x, w Tensor) error {
	const op = "matmul"
	if w.Cols() != x.Cols() {
		return fmt.Errorf("%s: x is [%d, %d] but w is [%d, %d]", op, x.Rows(), x.Cols(), w.Rows(), w.Cols())
	}
	if dst.Rows() != x.Rows() || dst.Cols() != w.Rows() {
		return shapeErr(op, "dst", dst, x.Rows(), w.Rows())
	}
	return nil
}

// CheckAddRows: dst like a, b like a or one row as wide.
func CheckAddRows(dst, a, b Tensor) error { return checkRowPair("add rows", dst, a, b) }

// checkRowPair is the check of an elementwise operation op of rows a and b: dst like a, b like a
// or one row as wide.
func checkRowPair(op string, dst, a, b Tensor) error {
	if dst.Rows() != a.Rows() || dst.Cols() != a.Cols() {
		return shapeErr(op, "dst", dst, a.Rows(), a.Cols())
	}
	if b.Cols() != a.Cols() || (b.Rows() != a.Rows() && b.Rows() != 1) {
		return fmt.Errorf("%s: b is [%d, %d], want [%d, %d] or [1, %d]", op, b.Rows(), b.Cols(), a.Rows(), a.Cols(), a.Cols())
	}
	return nil
}

// CheckRMSNorm: dst like x, w [1, cols of x] or [1, g] with g dividing them (groups of g
// normalised apart), eps finite and above 0.
func CheckRMSNorm(dst, x, w Tensor, eps float32) error {
	const op = "rms norm"
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	if w.Rows() != 1 || w.Cols() != x.Cols() && (w.Cols() <= 0 || x.Cols()%w.Cols() != 0) {
		return fmt.Errorf("%s: w is [%d, %d], want [1, %d] or [1, g] with g dividing %d", op, w.Rows(), w.Cols(), x.Cols(), x.Cols())
	}
	return checkEps(op, eps)
}

// CheckScale: dst shaped like x, s finite.
func CheckScale(dst, x Tensor, s float32) error {
	const op = "scale"
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	if s != s || math.IsInf(float64(s), 0) {
		return fmt.Errorf("%s: factor %v, want a finite value", op, s)
	}
	return nil
}

// CheckSwiGLU: up and dst shaped like gate.
func CheckSwiGLU(dst, gate, up Tensor) error { return CheckGLU("swiglu", dst, gate, up, tensor.SiLU) }

// CheckGeGLU: up and dst shaped like gate.
func CheckGeGLU(dst, gate, up Tensor) error { return CheckGLU("geglu", dst, gate, up, tensor.GELU) }

// CheckGLU: up and dst shaped like gate, f one of tensor.Func's functions (the operation named
// op: "glu", "swiglu", "geglu").
func CheckGLU(op string, dst, gate, up Tensor, f Func) error {
	if up.Rows() != gate.Rows() || up.Cols() != gate.Cols() {
		return shapeErr(op, "up", up, gate.Rows(), gate.Cols())
	}
	if dst.Rows() != gate.Rows() || dst.Cols() != gate.Cols() {
		return shapeErr(op, "dst", dst, gate.Rows(), gate.Cols())
	}
	return checkFunc(op, f)
}

// CheckUnary: dst shaped like x, f one of tensor.Func's functions (the operation named op:
// "unary", "gelu").
func CheckUnary(op string, dst, x Tensor, f Func) error {
	if err := CheckSameShape(op, dst, x); err != nil {
		return err
	}
	return checkFunc(op, f)
}

// checkFunc: f is one of tensor.Func's functions.
func checkFunc(op string, f Func) error {
	if !f.Known() {
		return fmt.Errorf("%s: %v is no elementwise function", op, f)
	}
	return nil
}

// CheckRope: a batch, a known mode (else an error wrapping ErrUnsupported), x [len(b.Pos),
// nHead*HeadDim] with nHead*HeadDim within int32, an even number of rotated dimensions from 2 to
// HeadDim, a base and a frequency scale finite and above 0, and no negative position.
func CheckRope(x Tensor, nHead int, r RoPE, b *Batch) error {
	const op = "rope"
	switch {
	case b == nil:
		return fmt.Errorf("%s: nil batch", op)
	case r.Mode != RoPENormal && r.Mode != RoPENeoX:
		return fmt.Errorf("%s: mode %d: %w", op, r.Mode, ErrUnsupported)
	case nHead <= 0 || r.HeadDim <= 0 || nHead > math.MaxInt32/r.HeadDim || x.Cols() != nHead*r.HeadDim:
		return fmt.Errorf("%s: x has %d columns, not %d heads of %d", op, x.Cols(), nHead, r.HeadDim)
	case r.Dims <= 0 || r.Dims%2 != 0 || r.Dims > r.HeadDim:
		return fmt.Errorf("%s: %d rotated dimensions of a head of %d, want an even number from 2 to %d", op, r.Dims, r.HeadDim, r.HeadDim)
	case !positive(r.Base):
		return fmt.Errorf("%s: base %v, want a finite value above 0", op, r.Base)
	case !positive(r.FreqScale):
		return fmt.Errorf("%s: frequency scale %v, want a finite value above 0", op, r.FreqScale)
	case r.AttnFactor != 0 && !positive(r.AttnFactor):
		return fmt.Errorf("%s: attention factor %v, want 0 (1) or a finite value above 0", op, r.AttnFactor)
	case !(r.ExtFactor >= 0 && r.ExtFactor <= 1) || math.IsInf(float64(r.CorrDims[0]), 0) || math.IsInf(float64(r.CorrDims[1]), 0) ||
		r.CorrDims[0] != r.CorrDims[0] || r.CorrDims[1] != r.CorrDims[1]:
		return fmt.Errorf("%s: YaRN extrapolation %v over pairs %v, want 0 to 1 over finite bounds", op, r.ExtFactor, r.CorrDims)
	case r.Factors != nil && len(r.Factors) != r.Dims/2:
		return fmt.Errorf("%s: %d frequency factors for %d rotated pairs", op, len(r.Factors), r.Dims/2)
	case len(b.Pos) != x.Rows():
		return fmt.Errorf("%s: %d positions for %d tokens", op, len(b.Pos), x.Rows())
	}
	for i, f := range r.Factors {
		if !positive(f) {
			return fmt.Errorf("%s: frequency factor %d is %v, want a finite value above 0", op, i, f)
		}
	}
	for i, p := range b.Pos {
		if p < 0 {
			return fmt.Errorf("%s: token %d at negative position %d", op, i, p)
		}
	}
	return nil
}

// CheckKVConfig: an F32 or F16 cache (else an error wrapping ErrUnsupported) of positive
// Layers, Width and BlockSize and of 1 to MaxInt32 slots (slots are int32 in a Batch).
func CheckKVConfig(cfg KVConfig) error {
	const op = "new kv"
	if cfg.DType != tensor.F32 && cfg.DType != tensor.F16 && cfg.DType != tensor.BF16 {
		return fmt.Errorf("%s: dtype %v (want F32, F16 or BF16): %w", op, cfg.DType, ErrUnsupported)
	}
	if cfg.Layers <= 0 || cfg.Slots <= 0 || cfg.Width <= 0 || cfg.BlockSize <= 0 || cfg.Slots > math.MaxInt32 {
		return fmt.Errorf("%s: bad config %+v", op, cfg)
	}
	return nil
}

// CheckLayer: layer is a layer of a cache of cfg.
func CheckLayer(op string, cfg KVConfig, layer int) error {
	if layer < 0 || layer >= cfg.Layers {
		return fmt.Errorf("%s: layer %d outside the cache's %d", op, layer, cfg.Layers)
	}
	return nil
}

// CheckStoreKV: a batch, k and v [len(b.Slot), Width], every slot a slot of the cache.
func CheckStoreKV(cfg KVConfig, k, v Tensor, b *Batch) error {
	const op = "store kv"
	if b == nil {
		return fmt.Errorf("%s: nil batch", op)
	}
	n := len(b.Slot)
	if k.Rows() != n || k.Cols() != cfg.Width {
		return shapeErr(op, "k", k, n, cfg.Width)
	}
	if v.Rows() != n || v.Cols() != cfg.Width {
		return shapeErr(op, "v", v, n, cfg.Width)
	}
	for i, s := range b.Slot {
		if s < 0 || int(s) >= cfg.Slots {
			return fmt.Errorf("%s: slot %d of token %d outside the cache's %d", op, s, i, cfg.Slots)
		}
	}
	return nil
}

// CheckAttention validates attention over a cache of cfg: a batch; heads that group and make the
// cache's width; a finite scale; q [len(b.Pos), NHead*HeadDim] and dst shaped like it; and
// sequences that each hold tokens [Start, Start+Count) of the batch, Count <= CtxLen <=
// cfg.Slots, with a block table whose first ceil(CtxLen/BlockSize) entries are blocks of the
// cache, every token of the batch in exactly one sequence.
//
// tok is scratch: CheckAttention returns it grown to len(b.Pos) (reallocated only when its
// capacity is short), holding the index in b.Seqs of each token's sequence when the batch is
// valid.
func CheckAttention(dst, q Tensor, cfg KVConfig, a Attn, b *Batch, tok []int32) ([]int32, error) {
	const op = "attention"
	if b == nil {
		return tok, fmt.Errorf("%s: nil batch", op)
	}
	if err := checkHeads(op, a); err != nil {
		return tok, err
	}
	if a.NKVHead*a.HeadDim != cfg.Width {
		return tok, fmt.Errorf("%s: %d kv heads of %d do not make the cache's width %d", op, a.NKVHead, a.HeadDim, cfg.Width)
	}
	if !finite(a.Scale) {
		return tok, fmt.Errorf("%s: scale %v", op, a.Scale)
	}
	n, qw := len(b.Pos), a.NHead*a.HeadDim
	if q.Cols() != qw {
		return tok, fmt.Errorf("%s: q has %d columns, not %d heads of %d", op, q.Cols(), a.NHead, a.HeadDim)
	}
	if q.Rows() != n {
		return tok, fmt.Errorf("%s: %d positions for %d tokens", op, n, q.Rows())
	}
	if dst.Rows() != n || dst.Cols() != qw {
		return tok, shapeErr(op, "dst", dst, n, qw)
	}
	bs := cfg.BlockSize
	if bs <= 0 {
		return tok, fmt.Errorf("%s: block size %d", op, bs)
	}
	nBlocks := cfg.Slots / bs
	if cap(tok) < n {
		tok = make([]int32, n, n+n/4)
	}
	tok = tok[:n]
	for i := range tok {
		tok[i] = -1
	}
	for si, s := range b.Seqs {
		switch {
		case s.Start < 0 || s.Count < 0 || s.Start > n-s.Count:
			return tok, fmt.Errorf("%s: sequence %d: tokens [%d, %d+%d) outside the batch of %d", op, si, s.Start, s.Start, s.Count, n)
		case s.Count > s.CtxLen:
			return tok, fmt.Errorf("%s: sequence %d: %d tokens but context length %d", op, si, s.Count, s.CtxLen)
		case s.CtxLen > cfg.Slots:
			return tok, fmt.Errorf("%s: sequence %d: context length %d exceeds the cache's %d slots", op, si, s.CtxLen, cfg.Slots)
		}
		need := s.CtxLen / bs
		if s.CtxLen%bs != 0 {
			need++
		}
		if len(s.Blocks) < need {
			return tok, fmt.Errorf("%s: sequence %d: context %d needs %d blocks, table has %d", op, si, s.CtxLen, need, len(s.Blocks))
		}
		for _, id := range s.Blocks[:need] {
			if id < 0 || int(id) >= nBlocks {
				return tok, fmt.Errorf("%s: sequence %d: block %d outside the cache's %d blocks", op, si, id, nBlocks)
			}
		}
		for i := s.Start; i < s.Start+s.Count; i++ {
			if tok[i] >= 0 {
				return tok, fmt.Errorf("%s: token %d is in sequences %d and %d", op, i, tok[i], si)
			}
			tok[i] = int32(si)
		}
	}
	for i, s := range tok {
		if s < 0 {
			return tok, fmt.Errorf("%s: token %d is in no sequence", op, i)
		}
	}
	return tok, nil
}

// CheckCopy: dst and src of one shape, each F32 or F16.
func CheckCopy(dst, src Tensor) error {
	for _, t := range []Tensor{src, dst} {
		if t.DType() != tensor.F32 && t.DType() != tensor.F16 {
			return fmt.Errorf("copy: %v into %v: %w", src.DType(), dst.DType(), ErrUnsupported)
		}
	}
	if dst.Rows() != src.Rows() || dst.Cols() != src.Cols() {
		return shapeErr("copy", "dst", dst, src.Rows(), src.Cols())
	}
	return nil
}

// CheckLayerNorm: dst like x, w and b [1, cols of x], eps finite and above 0.
func CheckLayerNorm(dst, x, w, b Tensor, eps float32) error {
	const op = "layer norm"
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	if w.Rows() != 1 || w.Cols() != x.Cols() {
		return shapeErr(op, "w", w, 1, x.Cols())
	}
	if b.Rows() != 1 || b.Cols() != x.Cols() {
		return shapeErr(op, "b", b, 1, x.Cols())
	}
	return checkEps(op, eps)
}

// CheckSameShape: dst shaped like x (elementwise operations).
func CheckSameShape(op string, dst, x Tensor) error {
	if dst.Rows() != x.Rows() || dst.Cols() != x.Cols() {
		return shapeErr(op, "dst", dst, x.Rows(), x.Cols())
	}
	return nil
}

// Im2Col1DShape returns the output rows (t+2*pad-kernel)/stride+1 and columns c*kernel of a
// 1-D convolution of a signal [t, c], or what is wrong with the geometry.
func Im2Col1DShape(t, c, kernel, stride, pad int) (tOut, cols int, err error) {
	switch {
	case kernel <= 0 || stride <= 0 || pad < 0 || kernel > math.MaxInt32 || stride > math.MaxInt32 || pad > math.MaxInt32/2 || t > math.MaxInt32/2:
		return 0, 0, fmt.Errorf("im2col: kernel %d, stride %d, padding %d over %d steps", kernel, stride, pad, t)
	case t+2*pad < kernel:
		return 0, 0, fmt.Errorf("im2col: a signal of %d steps padded by %d is shorter than the kernel %d", t, pad, kernel)
	case c > 0 && kernel > math.MaxInt32/c:
		return 0, 0, fmt.Errorf("im2col: %d channels of kernel %d is too large", c, kernel)
	}
	return (t+2*pad-kernel)/stride + 1, c * kernel, nil
}

// CheckIm2Col1D validates the convolution's geometry and dst's shape and returns the number of
// output steps.
func CheckIm2Col1D(dst, x Tensor, kernel, stride, pad int) (int, error) {
	tOut, cols, err := Im2Col1DShape(x.Rows(), x.Cols(), kernel, stride, pad)
	if err != nil {
		return 0, err
	}
	if dst.Rows() != tOut || dst.Cols() != cols {
		return 0, shapeErr("im2col", "dst", dst, tOut, cols)
	}
	return tOut, nil
}

// CheckFullAttention: heads that divide, q [n, NHead*HeadDim], k and v of one float type and
// shape [m, NKVHead*HeadDim] with m >= 1 when n >= 1. (dst must be shaped like q.)
func CheckFullAttention(q, k, v Tensor, a Attn) error {
	const op = "full attention"
	if err := checkHeads(op, a); err != nil {
		return err
	}
	if k.DType() != v.DType() || (k.DType() != tensor.F32 && k.DType() != tensor.F16) {
		return fmt.Errorf("%s: k is %v and v is %v, want both F32 or both F16", op, k.DType(), v.DType())
	}
	if !finite(a.Scale) {
		return fmt.Errorf("%s: scale %v", op, a.Scale)
	}
	qw, kw := a.NHead*a.HeadDim, a.NKVHead*a.HeadDim
	if q.Cols() != qw {
		return fmt.Errorf("%s: q has %d columns, not %d heads of %d", op, q.Cols(), a.NHead, a.HeadDim)
	}
	if (q.Rows() > 0 && k.Rows() < 1) || k.Cols() != kw {
		return shapeErr(op, "k", k, max(k.Rows(), 1), kw)
	}
	if v.Rows() != k.Rows() || v.Cols() != kw {
		return shapeErr(op, "v", v, k.Rows(), kw)
	}
	return nil
}

// Checks of the operations of streaming codecs and flow-matching heads (Mul, Reshape).

// CheckMul: dst like a, b like a or one row as wide.
func CheckMul(dst, a, b Tensor) error { return checkRowPair("mul", dst, a, b) }

// CheckReshape: rows and cols not negative, and rows*cols elements, t's number.
func CheckReshape(t Tensor, rows, cols int) error {
	const op = "reshape"
	n := int64(t.Rows()) * int64(t.Cols())
	if rows < 0 || cols < 0 || (cols != 0 && int64(rows) > n/int64(cols)) || int64(rows)*int64(cols) != n {
		return fmt.Errorf("%s: [%d, %d] into [%d, %d]: the number of elements differs", op, t.Rows(), t.Cols(), rows, cols)
	}
	return nil
}

// The checks of the convolutional encoders' and transducers' operations (Im2Col2D,
// DepthwiseConv2D, RelPosAttention, LSTMCell).

// maxConvDim bounds each field of a ConvGeom, so that the index arithmetic of every backend
// stays far inside int64 and the output's size inside int32.
const maxConvDim = 1 << 24

// CheckConvGeom: every size of g at least 1 (paddings at least 0) and at most 2^24, an image of
// at most 2^31-1 pixels, at most 2^16 taps, and a kernel that fits the padded image.
func CheckConvGeom(op string, g ConvGeom) error {
	for _, v := range [...]int{g.H, g.W, g.KH, g.KW, g.SH, g.SW} {
		if v < 1 || v > maxConvDim {
			return fmt.Errorf("%s: geometry %+v: sizes must be 1 to %d", op, g, maxConvDim)
		}
	}
	switch {
	case g.PH < 0 || g.PW < 0 || g.PH > maxConvDim || g.PW > maxConvDim:
		return fmt.Errorf("%s: geometry %+v: paddings must be 0 to %d", op, g, maxConvDim)
	case int64(g.H)*int64(g.W) > math.MaxInt32 || int64(g.KH)*int64(g.KW) > 1<<16:
		return fmt.Errorf("%s: geometry %+v: more than 2^31-1 pixels or 2^16 taps", op, g)
	case g.H+2*g.PH < g.KH || g.W+2*g.PW < g.KW:
		return fmt.Errorf("%s: geometry %+v: the kernel is larger than the padded image", op, g)
	}
	if ho, wo := g.Out(); int64(ho)*int64(wo) > math.MaxInt32 {
		return fmt.Errorf("%s: geometry %+v: more than 2^31-1 output pixels", op, g)
	}
	return nil
}

// CheckIm2Col2D: a valid geometry, x [H*W, C], dst [Hout*Wout, C*KH*KW].
func CheckIm2Col2D(dst, x Tensor, g ConvGeom) error {
	const op = "im2col 2d"
	if err := CheckConvGeom(op, g); err != nil {
		return err
	}
	if x.Rows() != g.H*g.W {
		return fmt.Errorf("%s: x has %d rows, not the %d×%d pixels of the image", op, x.Rows(), g.H, g.W)
	}
	if x.Cols() > math.MaxInt32/(g.KH*g.KW) {
		return fmt.Errorf("%s: %d channels of %d taps is too large", op, x.Cols(), g.KH*g.KW)
	}
	ho, wo := g.Out()
	if dst.Rows() != ho*wo || dst.Cols() != x.Cols()*g.KH*g.KW {
		return shapeErr(op, "dst", dst, ho*wo, x.Cols()*g.KH*g.KW)
	}
	return nil
}

// CheckDepthwiseConv2D: a valid geometry, x [H*W, C], w [C, KH*KW], b [1, C], dst
// [Hout*Wout, C].
func CheckDepthwiseConv2D(dst, x, w, b Tensor, g ConvGeom) error {
	const op = "depthwise conv 2d"
	if err := CheckConvGeom(op, g); err != nil {
		return err
	}
	c := x.Cols()
	if x.Rows() != g.H*g.W {
		return fmt.Errorf("%s: x has %d rows, not the %d×%d pixels of the image", op, x.Rows(), g.H, g.W)
	}
	if w.Rows() != c || w.Cols() != g.KH*g.KW {
		return shapeErr(op, "w", w, c, g.KH*g.KW)
	}
	if b.Rows() != 1 || b.Cols() != c {
		return shapeErr(op, "b", b, 1, c)
	}
	ho, wo := g.Out()
	if dst.Rows() != ho*wo || dst.Cols() != c {
		return shapeErr(op, "dst", dst, ho*wo, c)
	}
	return nil
}

// CheckRelPosAttention: heads of at most 2^31-1 columns and a finite scale; q, k, v and dst
// [n, NHead*HeadDim]; u and bv [1, NHead*HeadDim]; p [2L-1, NHead*HeadDim]; clips of at least
// one row each making up the n rows; a window of 0 or more; and L-1 at least every distance
// attended to (the longest clip's less one, or the window if that is smaller).
func CheckRelPosAttention(dst, q, k, v, p, u, bv Tensor, a RelPos, clips []int32) error {
	const op = "relpos attention"
	if a.NHead <= 0 || a.HeadDim <= 0 || a.NHead > math.MaxInt32/a.HeadDim {
		return fmt.Errorf("%s: %d heads of %d", op, a.NHead, a.HeadDim)
	}
	if !finite(a.Scale) {
		return fmt.Errorf("%s: scale %v", op, a.Scale)
	}
	if a.Window < 0 || a.Window > math.MaxInt32 {
		return fmt.Errorf("%s: window %d", op, a.Window)
	}
	width, n := a.NHead*a.HeadDim, q.Rows()
	if q.Cols() != width {
		return fmt.Errorf("%s: q has %d columns, not %d heads of %d", op, q.Cols(), a.NHead, a.HeadDim)
	}
	for _, c := range []struct {
		what string
		t    Tensor
		rows int
	}{{"k", k, n}, {"v", v, n}, {"dst", dst, n}, {"u", u, 1}, {"bv", bv, 1}} {
		if c.t.Rows() != c.rows || c.t.Cols() != width {
			return shapeErr(op, c.what, c.t, c.rows, width)
		}
	}
	sum, longest := 0, 0
	for i, c := range clips {
		if c < 1 || int(c) > n-sum {
			return fmt.Errorf("%s: clip %d has %d rows, with %d of the %d rows left", op, i, c, n-sum, n)
		}
		sum += int(c)
		longest = max(longest, int(c))
	}
	if sum != n {
		return fmt.Errorf("%s: the clips hold %d rows, q %d", op, sum, n)
	}
	reach := longest - 1
	if a.Window > 0 {
		reach = min(reach, a.Window)
	}
	if p.Cols() != width || p.Rows()%2 != 1 || (p.Rows()-1)/2 < reach {
		return fmt.Errorf("%s: p is [%d, %d], want [2L-1, %d] with L-1 at least %d, the longest distance attended to", op, p.Rows(), p.Cols(), width, reach)
	}
	return nil
}

// CheckLSTMCell: gates [n, 4P], h and c [n, P].
func CheckLSTMCell(h, c, gates Tensor) error {
	const op = "lstm cell"
	if gates.Cols()%4 != 0 {
		return fmt.Errorf("%s: gates have %d columns, not four blocks", op, gates.Cols())
	}
	n, p := gates.Rows(), gates.Cols()/4
	if c.Rows() != n || c.Cols() != p {
		return shapeErr(op, "c", c, n, p)
	}
	if h.Rows() != n || h.Cols() != p {
		return shapeErr(op, "h", h, n, p)
	}
	return nil
}
