//go:build cuda && cgo && !nocgo

package cuda

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// fake returns a context with no C context behind it and buffers of the given sizes over host
// memory: the argument checks run as usual, and a call that passes them reaches C, which
// refuses the null context. Nothing is dereferenced.
func fake(sizes ...int) (*Context, []*Buffer) {
	c := &Context{}
	bufs := make([]*Buffer, len(sizes))
	for i, n := range sizes {
		mem := make([]byte, max(n, 1))
		bufs[i] = &Buffer{ctx: c, p: unsafe.Pointer(&mem[0]), n: n}
	}
	return c, bufs
}

// TestArgumentChecks checks that every operation refuses out-of-range memory, ids, slots and
// shapes before it reaches C, and that calls with good arguments reach C (which then refuses the
// missing context with an "invalid argument" error instead of crashing).
func TestArgumentChecks(t *testing.T) {
	const n, k, m = 3, 64, 5
	c, b := fake(n*k*4, m*k*4, n*m*4, 10)
	x, w, dst, small := Ref{Buf: b[0]}, Ref{Buf: b[1]}, Ref{Buf: b[2]}, Ref{Buf: b[3]}
	other, ob := fake(n * k * 4)
	_ = other
	closed := &Buffer{ctx: c, p: b[0].p, n: b[0].n, done: true}

	bad := []struct {
		name string
		err  error
	}{
		{"MatMul dst too small", c.MatMul(small, x, n, k, w, tensor.F32, m)},
		{"MatMul x past its buffer", c.MatMul(dst, Ref{Buf: b[0], Off: 4}, n, k, w, tensor.F32, m)},
		{"MatMul negative offset", c.MatMul(dst, Ref{Buf: b[0], Off: -4}, n, k, w, tensor.F32, m)},
		{"MatMul Q8_0 with k not a multiple of 32", c.MatMul(dst, x, n, 33, w, tensor.Q8_0, m)},
		{"MatMul unsupported weights", c.MatMul(dst, x, n, 256, w, tensor.IQ2_XXS, m)},
		{"MatMul buffer of another context", c.MatMul(dst, Ref{Buf: ob[0]}, n, k, w, tensor.F32, m)},
		{"MatMul closed buffer", c.MatMul(dst, Ref{Buf: closed}, n, k, w, tensor.F32, m)},
		{"MatMuls five matrices", c.MatMuls(make([]Ref, 5), x, n, k, make([]Ref, 5), tensor.F16, make([]int, 5))},
		{"MatMuls counts", c.MatMuls([]Ref{dst, dst}, x, n, k, []Ref{w}, tensor.F16, []int{m, m})},
		{"MatMuls dst too small", c.MatMuls([]Ref{dst, small}, x, n, k, []Ref{w, w}, tensor.Q8_0, []int{m, m})},
		{"MatMul nil buffer", c.MatMul(dst, Ref{}, n, k, w, tensor.F32, m)},
		{"MatMul size overflows", c.MatMul(dst, x, 1<<40, 1<<40, w, tensor.F32, m)},
		{"GetRows id out of range", c.GetRows(dst, w, tensor.F32, m, k, []int32{0, int32(m)})},
		{"GetRows negative id", c.GetRows(dst, w, tensor.F32, m, k, []int32{-1})},
		{"AddRows b rows", c.AddRows(x, x, x, n, k, 2)},
		{"RMSNorm w too small", c.RMSNorm(x, x, small, n, k, 1e-5)},
		{"Unary no function", c.Unary(x, x, n*k, 0)},
		{"Unary x too small", c.Unary(x, small, n*k, tensor.ReLU)},
		{"GLU up too small", c.GLU(x, x, small, n*k, tensor.SiLU)},
		{"Rope positions", c.Rope(x, n, 4, RoPE{HeadDim: 16, Dims: 16, Base: 1e4, FreqScale: 1}, []int32{0})},
		{"StoreKV slot out of range", c.StoreKV(w, w, tensor.F32, m, k, x, x, 1, []int32{int32(m)})},
		{"StoreKV Q8_0 cache", c.StoreKV(w, w, tensor.Q8_0, m, k, x, x, 1, []int32{0})},
		{"Attention block out of range", c.Attention(x, x, 1, w, w, tensor.F32, m, k, 1, Attn{NHead: 1, NKVHead: 1, HeadDim: k, Scale: 1},
			[]Seq{{Start: 0, Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{int32(m)})},
		{"Attention sequence past the batch", c.Attention(x, x, 1, w, w, tensor.F32, m, k, 1, Attn{NHead: 1, NKVHead: 1, HeadDim: k, Scale: 1},
			[]Seq{{Start: 1, Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{0})},
		{"Attention heads", c.Attention(x, x, 1, w, w, tensor.F32, m, k, 1, Attn{NHead: 3, NKVHead: 2, HeadDim: k, Scale: 1}, nil, nil)},
		{"FullAttention no keys", c.FullAttention(x, x, 1, w, w, tensor.F32, 0, Attn{NHead: 1, NKVHead: 1, HeadDim: k, Scale: 1})},
		{"Copy Q8_0", c.Copy(x, tensor.F32, w, tensor.Q8_0, 32)},
		{"Im2Col1D dst too small", c.Im2Col1D(small, x, n, k, 1, 1, 0, n)},
		{"Argmax ids", c.Argmax(x, n, k, make([]int32, n-1))},
		{"Draw negative temperature", c.Draw(x, n, k, slices.Repeat([]tensor.Draw{{Temperature: -1, TopP: 1}}, n), make([]int32, n))},
		{"Draw top-p 0", c.Draw(x, n, k, slices.Repeat([]tensor.Draw{{Temperature: 1}}, n), make([]int32, n))},
		{"Draw rows", c.Draw(x, n, k, slices.Repeat([]tensor.Draw{{Temperature: 1, TopP: 1}}, n-1), make([]int32, n))},
		{"BeamStep k > vocab", c.BeamStep(x, k, make([]float32, n), 1, 1, make([]int32, k+1), make([]int32, k+1), make([]float32, k+1), make([]float32, k+1))},
		{"BeamStep output lengths", c.BeamStep(x, k, make([]float32, n), 1, 1, make([]int32, 2), make([]int32, 1), make([]float32, 2), make([]float32, 2))},
		{"Choose k > vocab", c.Choose(x, k, make([]tensor.Choice, n), nil, k+1, make([]tensor.Chosen, n), make([]int32, n*(k+1)), make([]float32, n*(k+1)))},
		{"Choose drop id", c.Choose(x, k, make([]tensor.Choice, n), []int32{k}, 1, make([]tensor.Chosen, n), make([]int32, n), make([]float32, n))},
		{"Choose cut", c.Choose(x, k, []tensor.Choice{{Cut: [4][2]int32{{0, k + 1}}, Split: k, Probe: -1}}, nil, 1, make([]tensor.Chosen, 1), make([]int32, 1), make([]float32, 1))},
		{"Choose output lengths", c.Choose(x, k, make([]tensor.Choice, n), nil, 2, make([]tensor.Chosen, n), make([]int32, n), make([]float32, n*2))},
		{"Choose rows past the logits", c.Choose(x, k, slices.Repeat([]tensor.Choice{{Split: k, Probe: -1}}, n+1), nil, 1, make([]tensor.Chosen, n+1), make([]int32, n+1), make([]float32, n+1))},
		{"Upload past the buffer", c.Upload(small, make([]byte, 11))},
		{"Download past the buffer", c.Download(make([]byte, 11), small)},
	}
	for _, tc := range bad {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		} else if strings.Contains(tc.err.Error(), "invalid argument:") {
			t.Errorf("%s: reached C: %v", tc.name, tc.err)
		}
	}
	if err := c.GetRows(dst, w, tensor.IQ2_XXS, m, 256, nil); !errors.Is(err, tensor.ErrUnsupported) {
		t.Errorf("GetRows of IQ2_XXS: %v, want ErrUnsupported", err)
	}

	good := []struct {
		name string
		err  error
	}{
		{"MatMul", c.MatMul(dst, x, n, k, w, tensor.F32, m)},
		{"MatMul Q8_0", c.MatMul(dst, x, n, k, w, tensor.Q8_0, m)},
		{"MatMuls Q8_0", c.MatMuls([]Ref{dst, dst}, x, n, k, []Ref{w, w}, tensor.Q8_0, []int{m, m})},
		{"GetRows", c.GetRows(x, w, tensor.F32, m, k, []int32{0, 4})},
		{"Unary", c.Unary(x, x, n*k, tensor.ELU)},
		{"GLU", c.GLU(x, x, x, n*k, tensor.Sigmoid)},
		{"Attention", c.Attention(x, x, 1, w, w, tensor.F32, m, k, 1, Attn{NHead: 1, NKVHead: 1, HeadDim: k, Scale: 1},
			[]Seq{{Start: 0, Count: 1, CtxLen: 1, NBlocks: 1}}, []int32{4})},
		{"Draw", c.Draw(x, n, k, slices.Repeat([]tensor.Draw{{Temperature: 0.7, TopK: 5, TopP: 0.9}, {TopP: 1}}, (n+1)/2)[:n], make([]int32, n))},
		{"Choose", c.Choose(x, k, slices.Repeat([]tensor.Choice{{Cut: [4][2]int32{{0, 3}}, Drop: [2]int32{0, 1}, Split: k - 4, Probe: 2}}, n), []int32{7}, 5,
			make([]tensor.Chosen, n), make([]int32, n*5), make([]float32, n*5))},
	}
	for _, tc := range good {
		if tc.err == nil || !strings.Contains(tc.err.Error(), "invalid argument") {
			t.Errorf("%s with good arguments on a missing context: %v, want C's invalid argument", tc.name, tc.err)
		}
	}
	if LiveBuffers() != 0 {
		t.Errorf("LiveBuffers() = %d, want 0 (fake buffers are not counted)", LiveBuffers())
	}
}

// TestSeqLayout checks that Seq has the C layout of plc_seq, which Attention passes as is.
func TestSeqLayout(t *testing.T) {
	if unsafe.Sizeof(Seq{}) != 20 || unsafe.Offsetof(Seq{}.NBlocks) != 16 {
		t.Fatalf("Seq is %d bytes with NBlocks at %d, want plc_seq's 20 and 16", unsafe.Sizeof(Seq{}), unsafe.Offsetof(Seq{}.NBlocks))
	}
}
