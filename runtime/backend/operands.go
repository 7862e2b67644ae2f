package backend

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Operands resolves and checks the operands of a backend's operations, the same way for every
// backend: one method per operation, which turns the interface values it is given into the
// backend's own tensors and caches (T, K) and returns them once everything all backends check
// holds, or an error prefixed with the backend's name:
//
//   - each tensor was made by this backend and is open, with the tensor it is a view of and the
//     backend itself (Residence, Owner);
//   - each has the dtype the operation takes (F32 activations, any weight type), and the
//     tensors an operation writes are not loaded weights;
//   - shapes and parameters agree (the Check functions of this package, whose words the error
//     ends with);
//   - the output and the inputs overlap only as the operation allows (Backend's comments: "dst
//     may be x" means dst is exactly x or shares no byte with it).
//
// What only one backend knows (a device's limits, a kernel it lacks for one case) it checks after.
// A backend keeps one Operands, made by NewOperands, and calls it at the top of each operation.
// An operand costs one type assertion and one call of its Residence method, which returns a
// pointer into the tensor; nothing allocates unless it returns an error, and Attention's scratch
// is the caller's.
type Operands[T OwnTensor, K OwnKV] struct {
	*Owner
}

// OwnTensor is a backend's tensor type as Operands sees it: a pointer type whose Residence says
// who made it, whether it is open and where its elements lie.
type OwnTensor interface {
	comparable
	Tensor
	Residence() *Residence
}

// OwnKV is a backend's KV cache type as Operands sees it (Residence's Owner and Closed).
type OwnKV interface {
	comparable
	KV
	Residence() *Residence
}

// Owner is a backend as its tensors name it: its name, for errors, and whether it is closed.
// Operands holds the backend's Owner, and every tensor and cache the backend makes records it.
type Owner struct {
	name   string
	caps   Capabilities
	closed atomic.Bool
}

// Name is the backend's name, which its errors begin with.
func (o *Owner) Name() string { return o.name }

// Capabilities is what the backend said it computes when it made its Operands.
func (o *Owner) Capabilities() Capabilities { return o.caps }

// Close marks the backend closed: its tensors and caches are no longer live. It reports whether
// the backend was open.
func (o *Owner) Close() bool { return !o.closed.Swap(true) }

// Closed reports whether Close was called.
func (o *Owner) Closed() bool { return o.closed.Load() }

// Residence is what the shared checks read of a tensor or cache besides its shape. A backend
// fills it when it makes the tensor, sets Closed when the tensor is closed, and changes nothing
// else.
type Residence struct {
	Owner    *Owner       // the backend that made it
	DType    tensor.DType // the tensor's element type
	ReadOnly bool         // it holds loaded weights, which no operation writes
	Closed   bool         // it was closed
	// View is the residence of the tensor this one is a view of (nil for one that is no view),
	// which must be open too.
	View *Residence
	// Addr and Bytes are where its elements lie: Bytes bytes from the address Addr in the memory
	// the backend computes in (host or device memory). Two tensors overlap where these ranges
	// intersect; an empty tensor overlaps nothing.
	Addr  uintptr
	Bytes int
}

// live reports whether r's tensor, the tensor it is a view of and its backend are open.
func (r *Residence) live() bool {
	return !r.Closed && (r.View == nil || !r.View.Closed) && !r.Owner.closed.Load()
}

// NewOperands returns the operand checks of a backend whose errors begin with name and which
// computes what caps says (its Ops are not read), and its Owner.
func NewOperands[T OwnTensor, K OwnKV](name string, caps Capabilities) Operands[T, K] {
	caps.Ops = 0
	return Operands[T, K]{&Owner{name: name, caps: caps}}
}

// errForeign is wrapped by the errors for an operand that is not one of the backend's own.
var errForeign = errors.New("tensor was not made by this backend")

// errorf returns an error for op prefixed with the backend's name, in the words of the shared checks.
func (o *Operands[T, K]) errorf(op, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", o.name, op, fmt.Sprintf(format, args...))
}

// wrap prefixes an error of a shared check with the backend's name.
func (o *Operands[T, K]) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", o.name, err)
}

// operand is what a resolved tensor is used for.
type operand uint8

const (
	anyType operand = iota // read, of any dtype
	f32In                  // read, F32
	f32Out                 // written, F32
	anyOut                 // written, F32 or F16 (Copy's destination)
)

// resolve returns t as a tensor of the backend fit for use. It is the path every operand of
// every call takes: one type assertion and one call of Residence, the errors built elsewhere.
func (o *Operands[T, K]) resolve(op, what string, t Tensor, use operand) (T, *Residence, error) {
	ct, ok := t.(T)
	var zero T
	if !ok || ct == zero {
		return zero, nil, o.badOperand(op, what, nil, use)
	}
	r := ct.Residence()
	if r.Owner != o.Owner || !r.live() || (use == f32In || use == f32Out) && r.DType != tensor.F32 || (use == f32Out || use == anyOut) && r.ReadOnly {
		return zero, r, o.badOperand(op, what, r, use)
	}
	return ct, r, nil
}

// badOperand says why an operand with residence r is not fit for use (nil: not a tensor of this
// backend).
func (o *Operands[T, K]) badOperand(op, what string, r *Residence, use operand) error {
	switch {
	case r == nil || r.Owner != o.Owner:
		return fmt.Errorf("%s: %s: %s: %w", o.name, op, what, errForeign)
	case !r.live():
		return o.errorf(op, "%s is closed", what)
	case (use == f32In || use == f32Out) && r.DType != tensor.F32:
		return o.errorf(op, "%s is %v, want F32", what, r.DType)
	}
	return o.errorf(op, "%s is a loaded weight tensor (read-only)", what)
}

// Tensor returns t as a live tensor of the backend, of any dtype, to read.
func (o *Operands[T, K]) Tensor(op, what string, t Tensor) (T, error) {
	ct, _, err := o.resolve(op, what, t, anyType)
	return ct, err
}

// F32 returns t as a live F32 tensor of the backend, to read.
func (o *Operands[T, K]) F32(op, what string, t Tensor) (T, error) {
	ct, _, err := o.resolve(op, what, t, f32In)
	return ct, err
}

// Out returns t as a live F32 tensor of the backend that an operation may write.
func (o *Operands[T, K]) Out(op, what string, t Tensor) (T, error) {
	ct, _, err := o.resolve(op, what, t, f32Out)
	return ct, err
}

// overlap reports whether two residences share a byte.
func overlap(a, b *Residence) bool {
	return a.Bytes > 0 && b.Bytes > 0 && a.Addr < b.Addr+uintptr(b.Bytes) && b.Addr < a.Addr+uintptr(a.Bytes)
}

// same reports whether two residences are the same bytes.
func same(a, b *Residence) bool { return a.Addr == b.Addr && a.Bytes == b.Bytes }

// apart reports whether an output may be written while x is read: they share no byte, or, when
// inPlace, they are the same bytes.
func apart(dst, x *Residence, inPlace bool) bool {
	return !overlap(dst, x) || (inPlace && same(dst, x))
}

// KV returns kv as a live cache of the backend, with layer one of its layers.
func (o *Operands[T, K]) KV(op string, kv KV, layer int) (K, error) {
	var zero K
	c, ok := kv.(K)
	if !ok || c == zero {
		return zero, fmt.Errorf("%s: %s: kv cache: %w", o.name, op, errForeign)
	}
	if r := c.Residence(); r.Owner != o.Owner {
		return zero, fmt.Errorf("%s: %s: kv cache: %w", o.name, op, errForeign)
	} else if !r.live() {
		return zero, o.errorf(op, "kv cache is closed")
	}
	if err := CheckLayer(op, c.Config(), layer); err != nil {
		return zero, o.wrap(err)
	}
	return c, nil
}

// Size checks a shape of dt for Load or Alloc and returns its size in bytes and the bytes of a
// row: rows and cols not negative, whole blocks a row, at most MaxInt/8 bytes in all (so that
// sizes derived from it cannot overflow).
func (o *Operands[T, K]) Size(op string, dt tensor.DType, rows, cols int) (n, rowBytes int, err error) {
	if rows < 0 || cols < 0 {
		return 0, 0, o.errorf(op, "negative shape %dx%d", rows, cols)
	}
	rs, err := dt.RowSize(int64(cols))
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %s: %w", o.name, op, err)
	}
	const limit = int64(^uint(0)>>1) / 8
	if rs > limit || (rs != 0 && int64(rows) > limit/rs) {
		return 0, 0, o.errorf(op, "%dx%d %v is too large", rows, cols, dt)
	}
	return int(int64(rows) * rs), int(rs), nil
}

// Alloc checks Alloc's arguments: an F32 or F16 tensor (else an error wrapping ErrUnsupported)
// of a shape Size accepts.
func (o *Operands[T, K]) Alloc(dt tensor.DType, rows, cols int) (n, rowBytes int, err error) {
	const op = "alloc"
	if dt != tensor.F32 && dt != tensor.F16 {
		return 0, 0, fmt.Errorf("%s: %s: dtype %v (want F32 or F16): %w", o.name, op, dt, ErrUnsupported)
	}
	return o.Size(op, dt, rows, cols)
}

// Load checks Load's arguments: one of the backend's weight types (else an error wrapping
// ErrUnsupported), a shape Size accepts and exactly its bytes.
func (o *Operands[T, K]) Load(dt tensor.DType, rows, cols int, data []byte) (n, rowBytes int, err error) {
	const op = "load"
	if !o.caps.Weights.Has(dt) {
		return 0, 0, fmt.Errorf("%s: %s: dtype %v: %w", o.name, op, dt, ErrUnsupported)
	}
	if n, rowBytes, err = o.Size(op, dt, rows, cols); err != nil {
		return 0, 0, err
	}
	if len(data) != n {
		return 0, 0, o.errorf(op, "%dx%d %v needs %d bytes, got %d", rows, cols, dt, n, len(data))
	}
	return n, rowBytes, nil
}

// Span resolves the F32 tensor that Write (write: the destination), Read or Argmax move n
// elements of from row row0 on (CheckSpan).
func (o *Operands[T, K]) Span(op, what string, t Tensor, row0, n int, write bool) (T, error) {
	use := f32In
	if write {
		use = f32Out
	}
	ct, _, err := o.resolve(op, what, t, use)
	if err != nil {
		return ct, err
	}
	if err := CheckSpan(op, ct, row0, n); err != nil {
		return ct, o.wrap(err)
	}
	return ct, nil
}

// Logits resolves the F32 tensor of logits whose rows row0 .. row0+rows-1 Argmax, Draw or Choose
// read (CheckSpan over those rows).
func (o *Operands[T, K]) Logits(op string, t Tensor, row0, rows int) (T, error) {
	ct, _, err := o.resolve(op, "logits", t, f32In)
	if err != nil {
		return ct, err
	}
	if err := CheckSpan(op, ct, row0, rows*ct.Cols()); err != nil {
		return ct, o.wrap(err)
	}
	return ct, nil
}

// View resolves the tensor View takes rows row0 .. row0+rows-1 of (CheckView).
func (o *Operands[T, K]) View(t Tensor, row0, rows int) (T, error) {
	ct, _, err := o.resolve("view", "t", t, anyType)
	if err != nil {
		return ct, err
	}
	return ct, o.wrap(CheckView(ct, row0, rows))
}

// GetRows resolves GetRows' operands (CheckGetRows); dst shares no byte with the table.
func (o *Operands[T, K]) GetRows(dst, table Tensor, ids []int32) (d, tb T, err error) {
	const op = "get rows"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, tb, err
	}
	tb, tr, err := o.resolve(op, "table", table, anyType)
	if err != nil {
		return d, tb, err
	}
	if err := CheckGetRows(d, tb, ids); err != nil {
		return d, tb, o.wrap(err)
	}
	if overlap(dr, tr) {
		return d, tb, o.errorf(op, "dst overlaps the table")
	}
	return d, tb, nil
}

// MatMul resolves MatMul's operands (CheckMatMul); dst shares no byte with x or w.
func (o *Operands[T, K]) MatMul(dst, x, w Tensor) (d, xt, wt T, err error) {
	const op = "matmul"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, wt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, wt, err
	}
	wt, wr, err := o.resolve(op, "w", w, anyType)
	if err != nil {
		return d, xt, wt, err
	}
	if err := CheckMatMul(d, xt, wt); err != nil {
		return d, xt, wt, o.wrap(err)
	}
	if overlap(dr, xr) || overlap(dr, wr) {
		return d, xt, wt, o.errorf(op, "dst must not overlap an operand")
	}
	return d, xt, wt, nil
}

// MatMuls resolves the products of MultiMatMuler.MatMuls into ds and ws (each len(w) long),
// each product as MatMul checks it, and no destination overlapping another product's operands
// or destination. It returns x.
func (o *Operands[T, K]) MatMuls(dst []Tensor, x Tensor, w []Tensor, ds, ws []T) (T, error) {
	const op = "matmul"
	var xt T
	if len(dst) != len(w) || len(ds) != len(w) || len(ws) != len(w) {
		return xt, o.errorf(op, "%d destinations for %d matrices", len(dst), len(w))
	}
	for i := range w {
		d, x1, wt, err := o.MatMul(dst[i], x, w[i])
		if err != nil {
			return xt, err
		}
		xt, ds[i], ws[i] = x1, d, wt
		dr := d.Residence()
		for j := range i {
			if overlap(dr, ds[j].Residence()) || overlap(dr, ws[j].Residence()) || overlap(ds[j].Residence(), wt.Residence()) {
				return xt, o.errorf(op, "a destination overlaps another product's")
			}
		}
	}
	return xt, nil
}

// AddRows resolves AddRows' operands (CheckAddRows); dst is a or apart from it, and is b (as
// many rows as a) or apart from it.
func (o *Operands[T, K]) AddRows(dst, a, b Tensor) (d, at, bt T, err error) {
	return o.rowPair("add rows", dst, a, b)
}

// rowPair resolves the operands of an elementwise operation op of rows a and b (checkRowPair);
// dst is a or apart from it, and is b (as many rows as a) or apart from it.
func (o *Operands[T, K]) rowPair(op string, dst, a, b Tensor) (d, at, bt T, err error) {
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, at, bt, err
	}
	at, ar, err := o.resolve(op, "a", a, f32In)
	if err != nil {
		return d, at, bt, err
	}
	bt, br, err := o.resolve(op, "b", b, f32In)
	if err != nil {
		return d, at, bt, err
	}
	if err := checkRowPair(op, d, at, bt); err != nil {
		return d, at, bt, o.wrap(err)
	}
	if !apart(dr, ar, true) || !apart(dr, br, bt.Rows() == at.Rows()) {
		return d, at, bt, o.errorf(op, "dst partly overlaps an operand")
	}
	return d, at, bt, nil
}

// RMSNorm resolves RMSNorm's operands (CheckRMSNorm); dst is x or apart from it, and apart
// from w.
func (o *Operands[T, K]) RMSNorm(dst, x, w Tensor, eps float32) (d, xt, wt T, err error) {
	const op = "rms norm"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, wt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, wt, err
	}
	wt, wr, err := o.resolve(op, "w", w, f32In)
	if err != nil {
		return d, xt, wt, err
	}
	if err := CheckRMSNorm(d, xt, wt, eps); err != nil {
		return d, xt, wt, o.wrap(err)
	}
	if overlap(dr, wr) || !apart(dr, xr, true) {
		return d, xt, wt, o.errorf(op, "dst overlaps the weight or part of x")
	}
	return d, xt, wt, nil
}

// Scale resolves Scale's operands (CheckScale); dst is x or apart from it.
func (o *Operands[T, K]) Scale(dst, x Tensor, s float32) (d, xt T, err error) {
	const op = "scale"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, err
	}
	if err := CheckScale(d, xt, s); err != nil {
		return d, xt, o.wrap(err)
	}
	if !apart(dr, xr, true) {
		return d, xt, o.errorf(op, "dst partly overlaps x")
	}
	return d, xt, nil
}

// GLU resolves the operands of a gated unit named op (GLU, SwiGLU, GeGLU) of the function f
// (CheckGLU; a function the backend does not state is refused with ErrUnsupported); dst is gate
// or apart from it, and up or apart from it.
func (o *Operands[T, K]) GLU(op string, dst, gate, up Tensor, f Func) (d, g, u T, err error) {
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, g, u, err
	}
	g, gr, err := o.resolve(op, "gate", gate, f32In)
	if err != nil {
		return d, g, u, err
	}
	u, ur, err := o.resolve(op, "up", up, f32In)
	if err != nil {
		return d, g, u, err
	}
	if err := CheckGLU(op, d, g, u, f); err != nil {
		return d, g, u, o.wrap(err)
	}
	if !o.caps.Funcs.Has(f) {
		return d, g, u, fmt.Errorf("%s: %s: function %v: %w", o.name, op, f, ErrUnsupported)
	}
	if !apart(dr, gr, true) || !apart(dr, ur, true) {
		return d, g, u, o.errorf(op, "dst partly overlaps an operand")
	}
	return d, g, u, nil
}

// Unary resolves the operands of the elementwise function f, in the operation named op (Unary,
// GELU) (CheckUnary; a function the backend does not state is refused with ErrUnsupported); dst
// is x or apart from it.
func (o *Operands[T, K]) Unary(op string, dst, x Tensor, f Func) (d, xt T, err error) {
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, err
	}
	if err := CheckUnary(op, d, xt, f); err != nil {
		return d, xt, o.wrap(err)
	}
	if !o.caps.Funcs.Has(f) {
		return d, xt, fmt.Errorf("%s: %s: function %v: %w", o.name, op, f, ErrUnsupported)
	}
	if !apart(dr, xr, true) {
		return d, xt, o.errorf(op, "dst partly overlaps x")
	}
	return d, xt, nil
}

// Rope resolves the tensor Rope rotates in place (CheckRope).
func (o *Operands[T, K]) Rope(x Tensor, nHead int, r RoPE, b *Batch) (T, error) {
	const op = "rope"
	xt, _, err := o.resolve(op, "x", x, f32Out)
	if err != nil {
		return xt, err
	}
	return xt, o.wrap(CheckRope(xt, nHead, r, b))
}

// NewKV checks a cache's configuration (CheckKVConfig), of one of the backend's cache types
// (else an error wrapping ErrUnsupported).
func (o *Operands[T, K]) NewKV(cfg KVConfig) error {
	if err := CheckKVConfig(cfg); err != nil {
		return o.wrap(err)
	}
	if !o.caps.KV.Has(cfg.DType) {
		return fmt.Errorf("%s: new kv: dtype %v: %w", o.name, cfg.DType, ErrUnsupported)
	}
	return nil
}

// StoreKV resolves StoreKV's operands (CheckLayer, CheckStoreKV).
func (o *Operands[T, K]) StoreKV(kv KV, layer int, k, v Tensor, b *Batch) (c K, kt, vt T, err error) {
	const op = "store kv"
	if c, err = o.KV(op, kv, layer); err != nil {
		return c, kt, vt, err
	}
	if kt, _, err = o.resolve(op, "k", k, f32In); err != nil {
		return c, kt, vt, err
	}
	if vt, _, err = o.resolve(op, "v", v, f32In); err != nil {
		return c, kt, vt, err
	}
	return c, kt, vt, o.wrap(CheckStoreKV(c.Config(), kt, vt, b))
}

// Attention resolves Attention's operands (CheckLayer, CheckAttention, which leaves in *tok the
// index in b.Seqs of each token's sequence); dst shares no byte with q. tok is the caller's
// scratch, grown to the largest batch seen; calls sharing it must not run at once.
func (o *Operands[T, K]) Attention(dst, q Tensor, kv KV, layer int, a Attn, b *Batch, tok *[]int32) (c K, d, qt T, err error) {
	const op = "attention"
	if c, err = o.KV(op, kv, layer); err != nil {
		return c, d, qt, err
	}
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return c, d, qt, err
	}
	qt, qr, err := o.resolve(op, "q", q, f32In)
	if err != nil {
		return c, d, qt, err
	}
	if *tok, err = CheckAttention(d, qt, c.Config(), a, b, *tok); err != nil {
		return c, d, qt, o.wrap(err)
	}
	if overlap(dr, qr) {
		return c, d, qt, o.errorf(op, "dst must not overlap q")
	}
	return c, d, qt, nil
}

// Flatten lays out b's sequences, which Attention has checked, as the native kernels take them:
// *seqs and *blocks (the caller's, reused) are overwritten with one entry a sequence and every
// sequence's block table one after another.
func (o *Operands[T, K]) Flatten(b *Batch, seqs *[]tensor.FlatSeq, blocks *[]int32) error {
	// The check leaves Start, Count and CtxLen non-negative and CtxLen at most the cache's slots
	// (an int32).
	ss, bl := (*seqs)[:0], (*blocks)[:0]
	for i, s := range b.Seqs {
		if s.Start > math.MaxInt32 || s.Count > math.MaxInt32 || len(s.Blocks) > math.MaxInt32-len(bl) {
			return o.errorf("attention", "sequence %d: bad range start=%d count=%d context=%d", i, s.Start, s.Count, s.CtxLen)
		}
		ss = append(ss, tensor.FlatSeq{Start: int32(s.Start), Count: int32(s.Count), CtxLen: int32(s.CtxLen),
			BlocksOff: int32(len(bl)), NBlocks: int32(len(s.Blocks))})
		bl = append(bl, s.Blocks...)
	}
	*seqs, *blocks = ss, bl
	return nil
}

// Copy resolves Copy's operands (CheckCopy): dst may be F16 but not loaded weights; dst is src
// or apart from it.
func (o *Operands[T, K]) Copy(dst, src Tensor) (d, s T, err error) {
	const op = "copy"
	d, dr, err := o.resolve(op, "dst", dst, anyOut)
	if err != nil {
		return d, s, err
	}
	s, sr, err := o.resolve(op, "src", src, anyType)
	if err != nil {
		return d, s, err
	}
	if err := CheckCopy(d, s); err != nil {
		return d, s, o.wrap(err)
	}
	if !apart(dr, sr, d.DType() == s.DType()) {
		return d, s, o.errorf(op, "dst partly overlaps src")
	}
	return d, s, nil
}

// LayerNorm resolves LayerNorm's operands (CheckLayerNorm); dst is x or apart from it, and
// apart from w and b.
func (o *Operands[T, K]) LayerNorm(dst, x, w, b Tensor, eps float32) (d, xt, wt, bt T, err error) {
	const op = "layer norm"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, wt, bt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	wt, wr, err := o.resolve(op, "w", w, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	bt, br, err := o.resolve(op, "b", b, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	if err := CheckLayerNorm(d, xt, wt, bt, eps); err != nil {
		return d, xt, wt, bt, o.wrap(err)
	}
	if overlap(dr, wr) || overlap(dr, br) || !apart(dr, xr, true) {
		return d, xt, wt, bt, o.errorf(op, "dst overlaps w, b or part of x")
	}
	return d, xt, wt, bt, nil
}

// Im2Col1D resolves Im2Col1D's operands (CheckIm2Col1D) and returns the output steps; dst shares
// no byte with x.
func (o *Operands[T, K]) Im2Col1D(dst, x Tensor, kernel, stride, pad int) (d, xt T, tOut int, err error) {
	const op = "im2col"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, 0, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, 0, err
	}
	if tOut, err = CheckIm2Col1D(d, xt, kernel, stride, pad); err != nil {
		return d, xt, 0, o.wrap(err)
	}
	if overlap(dr, xr) {
		return d, xt, 0, o.errorf(op, "dst overlaps x")
	}
	return d, xt, tOut, nil
}

// FullAttention resolves FullAttention's operands (CheckFullAttention, dst shaped like q); dst
// shares no byte with q, k or v.
func (o *Operands[T, K]) FullAttention(dst, q, k, v Tensor, a Attn) (d, qt, kt, vt T, err error) {
	const op = "full attention"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, qt, kt, vt, err
	}
	qt, qr, err := o.resolve(op, "q", q, f32In)
	if err != nil {
		return d, qt, kt, vt, err
	}
	kt, kr, err := o.resolve(op, "k", k, anyType)
	if err != nil {
		return d, qt, kt, vt, err
	}
	vt, vr, err := o.resolve(op, "v", v, anyType)
	if err != nil {
		return d, qt, kt, vt, err
	}
	if err := CheckFullAttention(qt, kt, vt, a); err != nil {
		return d, qt, kt, vt, o.wrap(err)
	}
	if err := CheckSameShape(op, d, qt); err != nil {
		return d, qt, kt, vt, o.wrap(err)
	}
	if overlap(dr, qr) || overlap(dr, kr) || overlap(dr, vr) {
		return d, qt, kt, vt, o.errorf(op, "dst must not overlap q, k or v")
	}
	return d, qt, kt, vt, nil
}

// Operands of the operations of streaming codecs and flow-matching heads (Mul, Reshape).

// Mul resolves Mul's operands (CheckMul); dst is a or apart from it, and is b (as many rows as
// a) or apart from it.
func (o *Operands[T, K]) Mul(dst, a, b Tensor) (d, at, bt T, err error) {
	return o.rowPair("mul", dst, a, b)
}

// Reshape resolves the F32 tensor Reshape reads as rows×cols (CheckReshape).
func (o *Operands[T, K]) Reshape(t Tensor, rows, cols int) (T, error) {
	ct, _, err := o.resolve("reshape", "t", t, f32In)
	if err != nil {
		return ct, err
	}
	return ct, o.wrap(CheckReshape(ct, rows, cols))
}

// The operands of the convolutional encoders' and transducers' operations.

// Im2Col2D resolves Im2Col2D's operands (CheckIm2Col2D); dst shares no byte with x.
func (o *Operands[T, K]) Im2Col2D(dst, x Tensor, g ConvGeom) (d, xt T, err error) {
	const op = "im2col 2d"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, err
	}
	if err := CheckIm2Col2D(d, xt, g); err != nil {
		return d, xt, o.wrap(err)
	}
	if overlap(dr, xr) {
		return d, xt, o.errorf(op, "dst overlaps x")
	}
	return d, xt, nil
}

// DepthwiseConv2D resolves DepthwiseConv2D's operands (CheckDepthwiseConv2D); dst shares no
// byte with x, w or b.
func (o *Operands[T, K]) DepthwiseConv2D(dst, x, w, b Tensor, g ConvGeom) (d, xt, wt, bt T, err error) {
	const op = "depthwise conv 2d"
	d, dr, err := o.resolve(op, "dst", dst, f32Out)
	if err != nil {
		return d, xt, wt, bt, err
	}
	xt, xr, err := o.resolve(op, "x", x, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	wt, wr, err := o.resolve(op, "w", w, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	bt, br, err := o.resolve(op, "b", b, f32In)
	if err != nil {
		return d, xt, wt, bt, err
	}
	if err := CheckDepthwiseConv2D(d, xt, wt, bt, g); err != nil {
		return d, xt, wt, bt, o.wrap(err)
	}
	if overlap(dr, xr) || overlap(dr, wr) || overlap(dr, br) {
		return d, xt, wt, bt, o.errorf(op, "dst overlaps x, w or b")
	}
	return d, xt, wt, bt, nil
}

// RelPosAttention resolves RelPosAttention's operands (CheckRelPosAttention) into ts: dst, q,
// k, v, p, u and bv, in that order; dst shares no byte with any of the others.
func (o *Operands[T, K]) RelPosAttention(dst, q, k, v, p, u, bv Tensor, a RelPos, clips []int32) (ts [7]T, err error) {
	const op = "relpos attention"
	var rs [7]*Residence
	for i, x := range [7]Tensor{dst, q, k, v, p, u, bv} {
		use := f32In
		if i == 0 {
			use = f32Out
		}
		if ts[i], rs[i], err = o.resolve(op, relPosNames[i], x, use); err != nil {
			return ts, err
		}
	}
	if err := CheckRelPosAttention(ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], a, clips); err != nil {
		return ts, o.wrap(err)
	}
	for _, r := range rs[1:] {
		if overlap(rs[0], r) {
			return ts, o.errorf(op, "dst overlaps an input")
		}
	}
	return ts, nil
}

var relPosNames = [7]string{"dst", "q", "k", "v", "p", "u", "bv"}

// LSTMCell resolves LSTMCell's operands (CheckLSTMCell); no two of them share a byte.
func (o *Operands[T, K]) LSTMCell(h, c, gates Tensor) (ht, ct, gt T, err error) {
	const op = "lstm cell"
	ht, hr, err := o.resolve(op, "h", h, f32Out)
	if err != nil {
		return ht, ct, gt, err
	}
	ct, cr, err := o.resolve(op, "c", c, f32Out)
	if err != nil {
		return ht, ct, gt, err
	}
	gt, gr, err := o.resolve(op, "gates", gates, f32In)
	if err != nil {
		return ht, ct, gt, err
	}
	if err := CheckLSTMCell(ht, ct, gt); err != nil {
		return ht, ct, gt, o.wrap(err)
	}
	if overlap(hr, cr) || overlap(hr, gr) || overlap(cr, gr) {
		return ht, ct, gt, o.errorf(op, "h, c and gates must not overlap")
	}
	return ht, ct, gt, nil
}
