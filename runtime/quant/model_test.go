package quant

import (
	"bytes"
	"math"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The stories260K quantised files hold tensors that llama.cpp quantised from the F32 file.
// Dequantising them must land within each format's per-block error bound of the F32 values
// (the bounds of TestQuantizeRoundTrip), and quantising the F32 tensors must reproduce
// llama.cpp's bytes exactly (these formats use the reference quantizers).
func TestRealModelTensors(t *testing.T) {
	dir := filepath.Join(sharedtest.Dir(t), "models", "llm")
	ref, err := readGGUF(filepath.Join(dir, "stories260K-ffn192-f32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"q4_0", "q8_0", "f16"} {
		file := filepath.Join(dir, "stories260K-ffn192-"+name+".gguf")
		ts, err := readGGUF(file)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[tensor.DType]int{}
		for tn, q := range ts {
			f, ok := ref[tn]
			if !ok {
				t.Fatalf("%s: tensor %q missing from the F32 file", name, tn)
			}
			if f.dt != tensor.F32 {
				t.Fatalf("F32 file: tensor %q is %v", tn, f.dt)
			}
			n := len(f.data) / 4
			want := make([]float32, n)
			if err := Dequantize(tensor.F32, f.data, want); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n)
			if err := Dequantize(q.dt, q.data, got); err != nil {
				t.Fatalf("%s %q: %v", name, tn, err)
			}
			seen[q.dt]++
			bs := q.dt.BlockSize()
			if bs == 1 {
				bs = 32
			}
			var se, sx float64
			for b := 0; b < n/bs; b++ {
				var amax float64
				for _, v := range want[b*bs : (b+1)*bs] {
					amax = math.Max(amax, math.Abs(float64(v)))
				}
				for i := b * bs; i < (b+1)*bs; i++ {
					x, y := float64(want[i]), float64(got[i])
					var bound float64
					switch q.dt {
					case tensor.F32:
						bound = 0
					case tensor.F16:
						bound = math.Max(math.Abs(x)/2048, math.Ldexp(1, -25)) // half ulp; subnormals below 2^-14
					case tensor.Q8_0:
						bound = amax/254 + amax/2048
					case tensor.Q4_0:
						bound = amax/8 + amax/2048
					default:
						t.Fatalf("%s %q: unexpected type %v", name, tn, q.dt)
					}
					if d := math.Abs(x - y); d > bound*(1+1e-5)+1e-12 {
						t.Fatalf("%s %q element %d: %g, F32 %g (error %g > %g)", name, tn, i, y, x, d, bound)
					}
					se += (x - y) * (x - y)
					sx += x * x
				}
			}
			if q.dt != tensor.F32 {
				// Re-quantise the F32 tensor: llama.cpp's bytes exactly.
				re := make([]byte, len(q.data))
				if err := Quantize(q.dt, want, re); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(re, q.data) {
					for i := range re {
						if re[i] != q.data[i] {
							t.Errorf("%s %q (%v): Quantize differs from the file at byte %d", name, tn, q.dt, i)
							break
						}
					}
				}
				t.Logf("%s %-26s %-5v relative RMS error %.4f", name, tn, q.dt, math.Sqrt(se/sx))
			}
		}
		if name == "q4_0" && (seen[tensor.Q4_0] == 0 || seen[tensor.Q8_0] == 0) {
			t.Errorf("q4_0 file: expected Q4_0 and Q8_0 tensors, saw %v", seen)
		}
	}
}
