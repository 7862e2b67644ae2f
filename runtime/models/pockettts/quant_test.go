package pockettts

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/runtime/safetensors"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestQuantizeFlowLMRoundTrip: QuantizeFlowLM turns exactly the FlowLM transformer's four
// matrices per layer into Q8_0; written as GGUF and read back, those hold every value within half
// a step of its block's scale (max |x| / 127) of the F32 original, and every other tensor is
// byte for byte the checkpoint's. Another type is refused.
func TestQuantizeFlowLMRoundTrip(t *testing.T) {
	cfg := tinyConfig()
	dir := t.TempDir()
	stPath := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(stPath, buildCheckpoint(t, cfg, func(int) safetensors.DType { return safetensors.F32 }, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := Open(stPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	orig := map[string][]float32{}
	for _, x := range src.Weights.All() {
		orig[x.Name] = x.Float32s()
	}
	if _, err := src.Weights.QuantizeFlowLM(tensor.Q4_K); err == nil {
		t.Errorf("Q4_K: no error")
	}
	n, err := src.Weights.QuantizeFlowLM(tensor.Q8_0)
	if err != nil || n != 4*cfg.Layers {
		t.Fatalf("quantised %d tensors (want %d): %v", n, 4*cfg.Layers, err)
	}
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, src.Weights, tinyTokenizer(t, cfg.Vocab), nil, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	ggPath := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(ggPath, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Open(ggPath)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	quantised := 0
	for _, x := range got.Weights.All() {
		want := orig[x.Name]
		if !quantisable(x.Name) {
			if x.DType != tensor.F32 {
				t.Errorf("%s: %v, want F32", x.Name, x.DType)
			}
			continue
		}
		quantised++
		if x.DType != tensor.Q8_0 {
			t.Errorf("%s: %v, want Q8_0", x.Name, x.DType)
			continue
		}
		v := x.Float32s()
		for b := 0; b < len(want); b += 32 {
			amax := 0.0
			for _, w := range want[b : b+32] {
				amax = math.Max(amax, math.Abs(float64(w)))
			}
			// the scale is stored as F16: allow its rounding (2^-11 relative) across the block
			bound := amax/127/2 + amax*1e-3
			for i := b; i < b+32; i++ {
				if d := math.Abs(float64(v[i]) - float64(want[i])); d > bound {
					t.Fatalf("%s[%d]: %v, the F32 value %v (bound %g)", x.Name, i, v[i], want[i], bound)
				}
			}
		}
	}
	if quantised != 4*cfg.Layers {
		t.Errorf("%d quantisable tensors in the GGUF file, want %d", quantised, 4*cfg.Layers)
	}
	for _, x := range src.Weights.All() {
		if quantisable(x.Name) {
			continue
		}
		for _, y := range got.Weights.All() {
			if y.Name == x.Name && !bytes.Equal(x.Data, y.Data) {
				t.Errorf("%s: the bytes changed", x.Name)
			}
		}
	}
}
