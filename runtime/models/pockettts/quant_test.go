package pockettts

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
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
		if !flowLMMatrix(x.Name) {
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
		if flowLMMatrix(x.Name) {
			continue
		}
		for _, y := range got.Weights.All() {
			if y.Name == x.Name && !bytes.Equal(x.Data, y.Data) {
				t.Errorf("%s: the bytes changed", x.Name)
			}
		}
	}
}

// TestCloneWeightsLoadedOnClone: New loads none of the voice-cloning weights (the Mimi encoder,
// the speaker projection); the first VoicePrompt loads exactly them (LoadedBytes grows by their
// size, in F32) and a second loads nothing more.
func TestCloneWeightsLoadedOnClone(t *testing.T) {
	cfg := tinyConfig()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, buildCheckpoint(t, cfg, func(int) safetensors.DType { return safetensors.F32 }, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var clone, all int64
	for _, x := range ck.Weights.All() {
		all += int64(len(x.Data))
		if x.Name == "flow_lm.speaker_proj_weight" || strings.HasPrefix(x.Name, "mimi.encoder") || strings.HasPrefix(x.Name, "mimi.downsample") {
			clone += int64(len(x.Data))
		}
	}
	var listed int64
	for _, x := range cloneTensors(ck.Weights) {
		listed += int64(len(x.Data))
	}
	if clone == 0 || listed != clone {
		t.Fatalf("the cloning weights hold %d bytes, cloneTensors %d", clone, listed)
	}
	for _, be := range sharedtest.Backends(t, 1) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := New(be, ck.Weights)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			before := m.LoadedBytes()
			if m.CloneLoaded() || before <= 0 || before > all-clone {
				t.Fatalf("after New: clone weights loaded %v, %d bytes loaded (the checkpoint %d, without the clone weights %d)", m.CloneLoaded(), before, all, all-clone)
			}
			audio := make([]float32, 3*cfg.FrameSamples()+7)
			for i := range audio {
				audio[i] = float32(math.Sin(float64(i) / 5))
			}
			if _, err := m.VoicePrompt(audio); err != nil {
				t.Fatal(err)
			}
			if got := m.LoadedBytes() - before; !m.CloneLoaded() || got != clone {
				t.Fatalf("after a clone: loaded %v, %d more bytes, want the clone weights' %d", m.CloneLoaded(), got, clone)
			}
			after := m.LoadedBytes()
			if _, err := m.VoicePrompt(audio); err != nil || m.LoadedBytes() != after {
				t.Fatalf("a second clone: %v, %d bytes loaded, want %d", err, m.LoadedBytes(), after)
			}
		})
	}
}

// TestQuantizeRoundTrip: Quantize with Q4_K turns the FlowLM transformer's matrices into Q4_K and
// the flow head's and the Mimi decoder transformer's (but the small input and output projections
// and the time embedding) into Q8_0; Quantize with Q8_0 turns all of them into Q8_0. Written as
// GGUF and read back, every quantised matrix is within its type's rounding of the F32 original
// (Q8_0: half a step of max |x| / 127 per block of 32; Q4_K: a step of the 32 values' range / 15,
// 4-bit steps with 6-bit scales, and a relative RMS error under 10%, about 6.7% for uniform
// values); every other tensor is byte for byte the checkpoint's.
func TestQuantizeRoundTrip(t *testing.T) {
	cfg := tinyConfig()
	cfg.Dim, cfg.FFDim, cfg.FlowDim = 256, 512, 32
	for _, dt := range []tensor.DType{tensor.Q8_0, tensor.Q4_K} {
		t.Run(dt.String(), func(t *testing.T) {
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
			orig := map[string][]byte{}
			for _, x := range src.Weights.All() {
				orig[x.Name] = slices.Clone(x.Data)
			}
			want := map[string]tensor.DType{}
			for _, x := range src.Weights.All() {
				switch {
				case flowLMMatrix(x.Name):
					want[x.Name] = dt
				case strings.HasPrefix(x.Name, "mimi.decoder_transformer.") && len(x.Shape) == 2,
					strings.HasPrefix(x.Name, "flow_lm.flow_net.") && len(x.Shape) == 2 && !strings.Contains(x.Name, "time_embed") &&
						!strings.Contains(x.Name, "input_proj") && !strings.Contains(x.Name, "final_layer.linear"):
					want[x.Name] = tensor.Q8_0
				}
			}
			wantN := 4*cfg.Layers + 4*cfg.MimiLayers + 2 + 3*cfg.FlowDepth
			if len(want) != wantN {
				t.Fatalf("%d matrices to quantise in the layout, want %d", len(want), wantN)
			}
			if _, err := src.Weights.Quantize(tensor.Q5_K); err == nil {
				t.Errorf("Q5_K: no error")
			}
			n, err := src.Weights.Quantize(dt)
			if err != nil || n != wantN {
				t.Fatalf("quantised %d tensors (want %d): %v", n, wantN, err)
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
			for _, x := range got.Weights.All() {
				wdt, quantised := want[x.Name]
				if !quantised {
					if x.DType != tensor.F32 || !bytes.Equal(x.Data, orig[x.Name]) {
						t.Errorf("%s: %v, changed: want the F32 original", x.Name, x.DType)
					}
					continue
				}
				if x.DType != wdt {
					t.Errorf("%s: %v, want %v", x.Name, x.DType, wdt)
					continue
				}
				ref := (&Tensor{Shape: x.Shape, DType: tensor.F32, Data: orig[x.Name]}).Float32s()
				v := x.Float32s()
				var d2, s2 float64
				for b := 0; b < len(ref); b += 32 {
					lo, hi := math.Inf(1), math.Inf(-1)
					for _, w := range ref[b : b+32] {
						lo, hi = min(lo, float64(w)), max(hi, float64(w))
					}
					amax := max(-lo, hi)
					bound := amax/127/2 + amax*1e-3 // Q8_0, its scale stored as F16
					if wdt == tensor.Q4_K {
						bound = (hi - lo) / 15
					}
					for i := b; i < b+32; i++ {
						d := float64(v[i]) - float64(ref[i])
						d2, s2 = d2+d*d, s2+float64(ref[i])*float64(ref[i])
						if math.Abs(d) > bound {
							t.Fatalf("%s[%d]: %v, the F32 value %v (bound %g)", x.Name, i, v[i], ref[i], bound)
						}
					}
				}
				if rel := math.Sqrt(d2 / s2); wdt == tensor.Q4_K && rel > 0.10 {
					t.Errorf("%s: relative RMS error %.3f", x.Name, rel)
				}
			}
		})
	}
}

// failingLoads is a backend whose Load fails while fail is set.
type failingLoads struct {
	backend.Backend
	fail bool
}

func (b *failingLoads) Load(dt tensor.DType, rows, cols int, data []byte) (backend.Tensor, error) {
	if b.fail {
		return nil, errors.New("out of device memory")
	}
	return b.Backend.Load(dt, rows, cols, data)
}

// TestCloneLoadRetried: a clone whose weights fail to load reports the failure and leaves
// nothing of them loaded; the next clone loads them and gives what a model that never failed
// gives.
func TestCloneLoadRetried(t *testing.T) {
	cfg := tinyConfig()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, buildCheckpoint(t, cfg, func(int) safetensors.DType { return safetensors.F32 }, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	audio := make([]float32, 2*cfg.FrameSamples()+3)
	for i := range audio {
		audio[i] = float32(math.Cos(float64(i) / 7))
	}
	be := sharedtest.Backends(t, 1)[0]
	ref, err := New(be, ck.Weights)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	want, err := ref.VoicePrompt(audio)
	if err != nil {
		t.Fatal(err)
	}
	fb := &failingLoads{Backend: be}
	m, err := New(fb, ck.Weights)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before, owned := m.LoadedBytes(), len(m.owned)
	fb.fail = true
	if _, err := m.VoicePrompt(audio); err == nil || !strings.Contains(err.Error(), "out of device memory") {
		t.Fatalf("a clone whose weights fail to load: %v, want the load's error", err)
	}
	if m.CloneLoaded() || m.LoadedBytes() != before || len(m.owned) != owned {
		t.Fatalf("after a failed load: loaded %v, %d bytes (was %d), %d tensors owned (was %d)", m.CloneLoaded(), m.LoadedBytes(), before, len(m.owned), owned)
	}
	fb.fail = false
	got, err := m.VoicePrompt(audio)
	if err != nil {
		t.Fatalf("the clone after a failed load: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the clone after a failed load differs from a model that never failed")
	}
}
