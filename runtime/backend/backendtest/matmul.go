package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// colsFor returns the row lengths a weight type is tested with: odd plain sizes for the float
// types, multiples of the block size (one block, a few, many) for the quantised ones.
func colsFor(dt tensor.DType) []int {
	switch dt.BlockSize() {
	case 1:
		return []int{1, 7, 33, 96, 256}
	case 32:
		return []int{32, 96, 256, 512}
	}
	return []int{256, 512, 768}
}

// convBound bounds the error that converting one activation element to a weight type's
// dot-product type (quant.VecDotType: F32, F16, BF16, Q8_0, Q8_1 or Q8_K) introduces before the
// dot product. A converted element x' of x obeys
//
//	|x' - x| <= rel*|x| + abs                      (float types: rounding)
//	|x' - x| <= 1.001 * amax(block)/254            (Q8 types: q = round(x*127/amax), step amax/127)
//
// and the block's stored scale (and, for Q8_1, its stored sum d*Σq, which multiplies the weight
// block's minimum) adds at most scaleRel * max|w in block| * Σ|x in block|. The 1.001 covers
// the reciprocal scale being rounded to float32 before x is multiplied by it.
type convBound struct {
	rel, abs float64
	block    int
	scaleRel float64
}

// matmulBounds gives each weight type's conversion bound. Every output element is also allowed
// (K+2)·2^-24·Σ|w·x|: the worst-case rounding of a K-term float32 dot product in any order of
// summation, which also covers the float32 products of block scales and integer block sums.
var matmulBounds = map[tensor.DType]convBound{
	// F32 activations are used as they are.
	tensor.F32: {},
	// Rounded to F16: relative error 2^-11 (binary16 unit roundoff), and at most 2^-25 absolute
	// for values in the subnormal range.
	tensor.F16: {rel: 0x1p-11, abs: 0x1p-25},
	// Rounded to BF16: relative error 2^-8.
	tensor.BF16: {rel: 0x1p-8},
	// Q8_0 (32 elements, F16 scale): 2^-11 for rounding the scale, 2^-11 spare.
	tensor.Q4_0: {block: 32, scaleRel: 0x1p-10},
	tensor.Q5_0: {block: 32, scaleRel: 0x1p-10},
	tensor.Q8_0: {block: 32, scaleRel: 0x1p-10},
	// Q8_1 (32 elements, F16 scale and F16 sum): 2^-11 for each.
	tensor.Q4_1: {block: 32, scaleRel: 0x1p-10},
	tensor.Q5_1: {block: 32, scaleRel: 0x1p-10},
	// Q8_K (256 elements, float32 scale, exact integer sums): the scale's rounding is 2^-24;
	// 2^-20 also covers float32 rounding where the K-quants subtract their minimum terms.
	tensor.Q4_K: {block: 256, scaleRel: 0x1p-20},
	tensor.Q5_K: {block: 256, scaleRel: 0x1p-20},
	tensor.Q6_K: {block: 256, scaleRel: 0x1p-20},
	// Q2_K has minimums like Q4_K: a block's dot is d_y*d*Σsc·q·y - d_y*dmin*Σm·bsum, two
	// float32 terms with about four roundings each (the activation scale, the product of the
	// two scales, its product with the exact integer sum, and the subtraction). Each term is
	// at most Σ(|w'| + 2·dmin·m)·|x'|, and dmin·m is at most max|w'| whenever a sub-block holds
	// a level 0 (as the fitted minimum makes it for these inputs), so the two together are at
	// most 3·max|w'|·Σ|x'| and their error 4·3·2^-24 < 2^-20 of that.
	tensor.Q2_K: {block: 256, scaleRel: 0x1p-20},
	// Q3_K has signed scales and a code offset (-4) that stay inside the integer sum, like
	// Q6_K's -32: one float32 term d_y*d*Σsc·(q-4)·y with |Σ| below 2^23, so about three
	// roundings of at most max|w'|·Σ|x'| each: 3·2^-24 < 2^-20.
	tensor.Q3_K: {block: 256, scaleRel: 0x1p-20},
	// IQ4_NL is laid out like Q4_0 (32 elements, one F16 scale) with Q8_0 activations: the
	// levels (at most 127 in magnitude) stay inside an exact integer sum (at most 32·127·127),
	// so a block's dot is one float32 term float32(Σ)·(d·d_y), as for Q4_0: the activation
	// scale's F16 rounding (2^-11) and the two float32 roundings, within 2^-10.
	tensor.IQ4_NL: {block: 32, scaleRel: 0x1p-10},
	// IQ4_XS has Q8_K activations and, like Q3_K, a signed scale per sub-block (6 bits, less
	// 32) that stays inside the integer sum: one float32 term d_y*d*Σ(ls-32)·kv·y per
	// super-block, of magnitude at most max|w'|·Σ|x'|. Its roundings are the activation scale
	// (2^-24), the product of the two scales, the conversion of the sum to float32 (it can
	// exceed 2^24: up to 8·32·32·127·127) and the final product: 4·2^-24 < 2^-20.
	tensor.IQ4_XS: {block: 256, scaleRel: 0x1p-20},
}

// matmulRef returns x·wᵀ in float64 for x [n, k] and dequantised w [m, k], and for each output
// element the bound its backend value must be within (see matmulBounds).
func matmulRef(dt tensor.DType, n, m, k int, x []float32, w []float64) (want, tol []float64) {
	cb := matmulBounds[dt]
	want = make([]float64, n*m)
	tol = make([]float64, n*m)
	var step []float64 // per element: half the Q8 step of its block
	if cb.block > 0 {
		step = make([]float64, k)
	}
	for i := 0; i < n; i++ {
		xi := x[i*k : (i+1)*k]
		if cb.block > 0 {
			for b0 := 0; b0 < k; b0 += cb.block {
				amax := 0.0
				for _, v := range xi[b0 : b0+cb.block] {
					amax = math.Max(amax, math.Abs(float64(v)))
				}
				for j := b0; j < b0+cb.block; j++ {
					step[j] = 1.001 * amax / 254
				}
			}
		}
		for j := 0; j < m; j++ {
			wj := w[j*k : (j+1)*k]
			var dot, s, conv float64
			for c, wv := range wj {
				xv := float64(xi[c])
				dot += wv * xv
				s += math.Abs(wv * xv)
				conv += math.Abs(wv) * (cb.rel*math.Abs(xv) + cb.abs)
				if cb.block > 0 {
					conv += math.Abs(wv) * step[c]
				}
			}
			if cb.block > 0 {
				for b0 := 0; b0 < k; b0 += cb.block {
					wmax, x1 := 0.0, 0.0
					for c := b0; c < b0+cb.block; c++ {
						wmax = math.Max(wmax, math.Abs(wj[c]))
						x1 += math.Abs(float64(xi[c]))
					}
					conv += cb.scaleRel * wmax * x1
				}
			}
			want[i*m+j] = dot
			tol[i*m+j] = float64(k+2)*u*s + conv + 1e-30
		}
	}
	return want, tol
}

func testMatMul(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const maxM, maxN = 67, 17
	for _, dt := range WeightDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			for _, k := range colsFor(dt) {
				r := rng(fmt.Sprintf("matmul %v %d", dt, k))
				data, wd := quantRows(t, dt, maxM, k, randVec(r, maxM*k, 0.5))
				xv := randVec(r, maxN*k, 1)
				rs := rowSize(t, dt, k)
				for _, m := range []int{1, 3, 17, maxM} {
					for _, w := range weightForms(t, b, dt, m, k, data[:m*rs]) {
						for _, n := range []int{1, 2, 5, 7, 8, 9, maxN} {
							x := alloc(t, b, n, k, xv[:n*k])
							if n > 1 {
								x = allocView(t, b, n, k, xv[:n*k])
							}
							dst, g := output(t, b, n, m)
							name := fmt.Sprintf("MatMul %v%s n=%d m=%d k=%d", dt, w.name, n, m, k)
							must(t, b.MatMul(dst, x, w.t), "%s", name)
							got := read(t, b, dst)
							want, tol := matmulRef(dt, n, m, k, xv, wd)
							compare(t, name, m, got, want, func(i int) float64 { return tol[i] })
							g.check(t)
							x.Close()
							dst.Close()
						}
						w.t.Close()
					}
				}
			}
		})
	}
	// Activations beyond F16's range (65504): most quantised types convert them to 8-bit blocks
	// with a scale each (an F16 scale: finite up to about 127·65504), so batches of them (where a
	// GPU backend may take F16 products) must not overflow; neither may F32 or BF16 weights. F16
	// weights round x to F16, as llama.cpp does, so there they would; so would Q4_1 and Q5_1,
	// whose activation blocks also hold d·Σq in F16 (llama.cpp's Q8_1).
	t.Run("large activations", func(t *testing.T) {
		const n, m = 17, 19
		for _, dt := range WeightDTypes {
			if dt == tensor.F16 || dt == tensor.Q4_1 || dt == tensor.Q5_1 {
				continue
			}
			k := colsFor(dt)[1]
			r := rng(fmt.Sprintf("matmul large %v", dt))
			data, wd := quantRows(t, dt, m, k, randVec(r, m*k, 0.5))
			xv := randVec(r, n*k, 1)
			for i, f := range map[int]float32{2: 3e5, 9: 7e4, 16: 4e5} {
				for c := range xv[i*k : (i+1)*k] {
					xv[i*k+c] *= f
				}
			}
			for _, w := range weightForms(t, b, dt, m, k, data) {
				x := allocView(t, b, n, k, xv)
				dst, g := output(t, b, n, m)
				name := fmt.Sprintf("MatMul %v%s n=%d m=%d k=%d, rows scaled by up to %g", dt, w.name, n, m, k, 4e5)
				must(t, b.MatMul(dst, x, w.t), "%s", name)
				want, tol := matmulRef(dt, n, m, k, xv, wd)
				compare(t, name, m, read(t, b, dst), want, func(i int) float64 { return tol[i] })
				g.check(t)
				x.Close()
				dst.Close()
				w.t.Close()
			}
		}
	})
	// Rows of no elements: every product is an empty sum, 0.
	t.Run("k=0", func(t *testing.T) {
		for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0} {
			w := load(t, b, dt, 3, 0, []byte{})
			dst, g := output(t, b, 2, 3)
			must(t, b.MatMul(dst, alloc(t, b, 2, 0, nil), w), "MatMul %v n=2 m=3 k=0", dt)
			compare(t, fmt.Sprintf("MatMul %v n=2 m=3 k=0", dt), 3, read(t, b, dst), make([]float64, 6), func(int) float64 { return 0 })
			g.check(t)
		}
	})
}

// testMatMuls checks backend.MatMuls: two or three matrices of one type (loaded, and repacked
// where the backend repacks) against one x give, bit for bit, what MatMul gives each, into
// guarded views; and its argument errors.
func testMatMuls(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	ms := []int{48, 17, 80} // whole and partial groups of sixteen rows
	for _, dt := range WeightDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			k := colsFor(dt)[len(colsFor(dt))-1]
			r := rng(fmt.Sprintf("matmuls %v %d", dt, k))
			rs := rowSize(t, dt, k)
			forms := make([][]weightForm, len(ms))
			for i, m := range ms {
				data, _ := quantRows(t, dt, m, k, randVec(r, m*k, 0.5))
				forms[i] = weightForms(t, b, dt, m, k, data[:m*rs])
			}
			xv := randVec(r, 9*k, 1)
			for f := range forms[0] {
				for _, count := range []int{2, 3} {
					for _, n := range []int{1, 3, 8, 9} {
						x := allocView(t, b, n, k, xv[:n*k])
						ws := make([]backend.Tensor, count)
						dsts := make([]backend.Tensor, count)
						guards := make([]*guards, count)
						want := make([][]float32, count)
						for i := range count {
							ws[i] = forms[i][f].t
							dsts[i], guards[i] = output(t, b, n, ms[i])
							one := alloc(t, b, n, ms[i], nil)
							must(t, b.MatMul(one, x, ws[i]), "MatMul")
							want[i] = read(t, b, one)
							one.Close()
						}
						name := fmt.Sprintf("MatMuls %v%s ×%d n=%d k=%d", dt, forms[0][f].name, count, n, k)
						must(t, backend.MatMuls(b, dsts, x, ws), "%s", name)
						for i := range count {
							got := read(t, b, dsts[i])
							for e := range got {
								if math.Float32bits(got[e]) != math.Float32bits(want[i][e]) {
									t.Fatalf("%s: matrix %d element %d: %v, MatMul gives %v", name, i, e, got[e], want[i][e])
								}
							}
							guards[i].check(t)
							dsts[i].Close()
						}
						x.Close()
					}
				}
			}
			for _, fs := range forms {
				for _, w := range fs {
					w.t.Close()
				}
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		x := alloc(t, b, 2, 32, nil)
		w := load(t, b, tensor.F32, 3, 32, make([]byte, 3*32*4))
		d1, d2 := alloc(t, b, 2, 3, nil), alloc(t, b, 2, 3, nil)
		if err := backend.MatMuls(b, []backend.Tensor{d1}, x, []backend.Tensor{w, w}); err == nil {
			t.Error("one destination for two matrices: no error")
		}
		if err := backend.MatMuls(b, []backend.Tensor{d1, d1}, x, []backend.Tensor{w, w}); err == nil {
			t.Error("a repeated destination: no error")
		}
		if err := backend.MatMuls(b, []backend.Tensor{d1, x}, x, []backend.Tensor{w, w}); err == nil {
			t.Error("x as a destination: no error")
		}
		must(t, backend.MatMuls(b, []backend.Tensor{d1, d2}, x, []backend.Tensor{w, w}), "MatMuls of zero weights")
	})
}

// testMatMulBatch checks that a token's result does not depend on the batch it is computed in.
// Backends take different paths for one token and for batches (tiles of rows, or dequantising to
// F32 for a BLAS product, which skips the activation conversion), so the rows of batches of
// different sizes may differ by the conversion bound, never more.
func testMatMulBatch(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const n, m = 37, 41
	for _, dt := range WeightDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			k := colsFor(dt)[1]
			r := rng(fmt.Sprintf("batch %v", dt))
			data, wd := quantRows(t, dt, m, k, randVec(r, m*k, 0.5))
			xv := randVec(r, n*k, 1)
			x := alloc(t, b, n, k, xv)
			_, tol := matmulRef(dt, n, m, k, xv, wd)
			for _, w := range weightForms(t, b, dt, m, k, data) {
				full := alloc(t, b, n, m, nil)
				must(t, b.MatMul(full, x, w.t), "MatMul %v%s n=%d", dt, w.name, n)
				fullv := read(t, b, full)
				for _, nb := range []int{1, 2, 3, 4, 5, 8, 9, 16, 33} {
					for i0 := 0; i0+nb <= n; i0 += nb + 7 {
						xb := alloc(t, b, nb, k, xv[i0*k:(i0+nb)*k])
						dst, g := output(t, b, nb, m)
						must(t, b.MatMul(dst, xb, w.t), "MatMul %v%s n=%d", dt, w.name, nb)
						got := read(t, b, dst)
						want := make([]float64, nb*m)
						for i := range want {
							want[i] = float64(fullv[i0*m+i])
						}
						compare(t, fmt.Sprintf("MatMul %v%s rows %d..%d alone vs in a batch of %d", dt, w.name, i0, i0+nb-1, n),
							m, got, want, func(i int) float64 { return tol[i0*m+i] })
						g.check(t)
						xb.Close()
						dst.Close()
					}
				}
				full.Close()
				w.t.Close()
			}
		})
	}
}

// weightForm is a weight tensor as loaded, or repacked (name " repacked").
type weightForm struct {
	name string
	t    backend.Tensor
}

// weightForms loads data as m rows of k elements of dt, and again repacked where the backend
// implements backend.Repacker and takes the case: every MatMul check runs on each form.
func weightForms(t *testing.T, b backend.Backend, dt tensor.DType, m, k int, data []byte) []weightForm {
	forms := []weightForm{{"", load(t, b, dt, m, k, data)}}
	if !backend.Supports(b, backend.OpRepack) {
		return forms
	}
	w := load(t, b, dt, m, k, data)
	ok, err := backend.Repack(b, w)
	if err != nil {
		t.Fatalf("Repack %v m=%d k=%d: %v", dt, m, k, err)
	}
	if !ok {
		w.Close()
		return forms
	}
	return append(forms, weightForm{" repacked", w})
}

// testGetRows checks GetRows against quant.Dequantize of the chosen rows. The values must be
// exactly those for F32, F16 and BF16; quantised types may differ from them by a few float32
// roundings (a backend may compute d*q+m with a fused multiply-add, or group the K-quants'
// d*sc*q differently): 2^-20 of the row's largest magnitude.
func testGetRows(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	const rows = 19
	idss := [][]int32{{7}, {0, rows - 1}, {3, 0, 18, 3, 7, 11, 11}}
	for _, dt := range WeightDTypes {
		t.Run(dt.String(), func(t *testing.T) {
			for _, k := range colsFor(dt) {
				r := rng(fmt.Sprintf("getrows %v %d", dt, k))
				data, wd := quantRows(t, dt, rows, k, randVec(r, rows*k, 1))
				table := load(t, b, dt, rows, k, data)
				for _, ids := range idss {
					dst, g := output(t, b, len(ids), k)
					must(t, b.GetRows(dst, table, ids), "GetRows %v k=%d ids=%v", dt, k, ids)
					got := read(t, b, dst)
					want := make([]float64, len(ids)*k)
					tol := make([]float64, len(ids))
					for i, id := range ids {
						row := wd[int(id)*k : int(id+1)*k]
						copy(want[i*k:], row)
						if dt.Quantized() {
							for _, v := range row {
								tol[i] = math.Max(tol[i], math.Abs(v)*0x1p-20)
							}
						}
					}
					compare(t, fmt.Sprintf("GetRows %v k=%d ids=%v", dt, k, ids), k, got, want,
						func(i int) float64 { return tol[i/k] })
					g.check(t)
					dst.Close()
				}
				table.Close()
			}
		})
	}
	t.Run("Activations", func(t *testing.T) {
		// Rows of an F32 activation tensor (a View of one), as a model gathers the rows whose
		// logits it needs: copied exactly.
		const cols = 33
		r := rng("getrows activations")
		vals := randVec(r, rows*cols, 1)
		table := allocView(t, b, rows, cols, vals)
		ids := []int32{18, 2, 2, 0}
		dst, g := output(t, b, len(ids), cols)
		must(t, b.GetRows(dst, table, ids), "GetRows from activations")
		want := make([]float64, 0, len(ids)*cols)
		for _, id := range ids {
			for _, v := range vals[int(id)*cols : int(id+1)*cols] {
				want = append(want, float64(v))
			}
		}
		compare(t, "GetRows from activations", cols, read(t, b, dst), want, func(int) float64 { return 0 })
		g.check(t)
	})
}
