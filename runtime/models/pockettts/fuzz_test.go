package pockettts

import (
	"bytes"
	"testing"

	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/safetensors"
)

// FuzzLoad: any file that parses as safetensors or GGUF loads or is refused, never panics; a
// checkpoint that loads has exactly its configuration's layout.
func FuzzLoad(f *testing.F) {
	cfg := tinyConfig()
	cfg.FFDim, cfg.Vocab, cfg.MimiFFDim = 64, 4, 64
	f32 := func(int) safetensors.DType { return safetensors.F32 }
	st := buildCheckpoint(f, cfg, f32, nil)
	f.Add(st)
	sf, err := safetensors.Parse(st)
	if err != nil {
		f.Fatal(err)
	}
	w, err := LoadSafetensors(sf)
	if err != nil {
		f.Fatal(err)
	}
	var gb bytes.Buffer
	if err := WriteGGUF(&gb, w, tinyTokenizer(f, cfg.Vocab), map[string]*Voice{"v": tinyVoice(cfg, 2)}, TextOptions{}); err != nil {
		f.Fatal(err)
	}
	f.Add(gb.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		var w *Weights
		if g, err := gguf.Parse(b); err == nil {
			ck, err := LoadGGUF(g)
			if err != nil {
				return
			}
			w = ck.Weights
		} else if s, err := safetensors.Parse(b); err == nil {
			if w, err = LoadSafetensors(s); err != nil {
				return
			}
		} else {
			return
		}
		if n := len(w.All()); n != len(w.Config.Layout()) {
			t.Fatalf("%d tensors bound, the layout has %d", n, len(w.Config.Layout()))
		}
		for _, tt := range w.All() {
			if len(tt.Data) != tt.Elements()*tt.DType.TypeSize() {
				t.Fatalf("tensor %q: %d bytes for %v of %v", tt.Name, len(tt.Data), tt.Shape, tt.DType)
			}
		}
	})
}
