package pockettts

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/parleyhq/parley/runtime/safetensors"
)

// Voice is a voice state: the FlowLM's KV cache after the voice prompt (the BOS vector, where the
// configuration has one, then one row per 80 ms of prompt audio). Every synthesis starts from a
// copy of it. Predefined voices and upstream's export_model_state write it as safetensors:
// "transformer.layers.{i}.self_attn/cache" [2, 1, T, heads, headDim] (keys, then values) and
// ".../offset" I64 [1] = the positions filled (older files: ".../current_end", whose length is
// the offset).
type Voice struct {
	Positions int
	Layers    []VoiceLayer
}

// VoiceLayer is one layer's cache. Keys are stored rotated (RoPE applied at their positions, as
// the attention writes them).
type VoiceLayer struct {
	K, V []float32 // [Positions, heads, headDim]
}

// Bytes returns the cache's size in bytes (float32).
func (v *Voice) Bytes() int {
	n := 0
	for _, l := range v.Layers {
		n += 4 * (len(l.K) + len(l.V))
	}
	return n
}

// LoadVoice reads a voice-state safetensors file for a model of configuration cfg.
func LoadVoice(path string, cfg *Config) (*Voice, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := ReadVoice(f, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

const voiceModule = "transformer.layers."

// ReadVoice reads a voice state from an opened safetensors file (the values are copied).
func ReadVoice(f *safetensors.File, cfg *Config) (*Voice, error) {
	type layerTensors struct{ cache, offset, currentEnd *safetensors.Tensor }
	layers := make([]layerTensors, cfg.Layers)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		module, key, ok := strings.Cut(t.Name, "/")
		rest, isLayer := strings.CutPrefix(module, voiceModule)
		idx, attn, _ := strings.Cut(rest, ".")
		l, err := strconv.Atoi(idx)
		if !ok || !isLayer || attn != "self_attn" || err != nil || l < 0 || l >= cfg.Layers || idx != strconv.Itoa(l) {
			return nil, fmt.Errorf("pockettts: voice state: unexpected tensor %q (want %s{0..%d}.self_attn/cache and /offset)", t.Name, voiceModule, cfg.Layers-1)
		}
		switch key {
		case "cache":
			layers[l].cache = t
		case "offset":
			layers[l].offset = t
		case "current_end":
			layers[l].currentEnd = t
		default:
			return nil, fmt.Errorf("pockettts: voice state: unexpected tensor %q", t.Name)
		}
	}
	heads, hd := cfg.Heads, cfg.HeadDim()
	v := &Voice{Positions: -1, Layers: make([]VoiceLayer, cfg.Layers)}
	for i, lt := range layers {
		name := fmt.Sprintf("%s%d.self_attn", voiceModule, i)
		if lt.cache == nil {
			return nil, fmt.Errorf("pockettts: voice state: %s/cache is missing", name)
		}
		var off int64
		switch {
		case lt.offset != nil && lt.currentEnd != nil:
			return nil, fmt.Errorf("pockettts: voice state: %s has both offset and current_end", name)
		case lt.offset != nil:
			o, err := f.Int64s(lt.offset)
			if err != nil || len(o) != 1 {
				return nil, fmt.Errorf("pockettts: voice state: %s/offset must be one integer (%v %v)", name, lt.offset.Shape, err)
			}
			off = o[0]
		case lt.currentEnd != nil:
			if len(lt.currentEnd.Shape) == 0 {
				return nil, fmt.Errorf("pockettts: voice state: %s/current_end is a scalar", name)
			}
			off = lt.currentEnd.Shape[0]
		default:
			return nil, fmt.Errorf("pockettts: voice state: %s/offset is missing", name)
		}
		c := lt.cache
		if len(c.Shape) != 5 || c.Shape[0] != 2 || c.Shape[1] != 1 || c.Shape[3] != int64(heads) || c.Shape[4] != int64(hd) {
			return nil, fmt.Errorf("pockettts: voice state: %s/cache has shape %v, want [2, 1, T, %d, %d]", name, c.Shape, heads, hd)
		}
		if off <= 0 || off > c.Shape[2] {
			return nil, fmt.Errorf("pockettts: voice state: %s: offset %d is outside the cache's %d positions", name, off, c.Shape[2])
		}
		if v.Positions >= 0 && int64(v.Positions) != off {
			return nil, fmt.Errorf("pockettts: voice state: %s: offset %d, layer 0 has %d", name, off, v.Positions)
		}
		v.Positions = int(off)
		vals, err := f.Float32s(c)
		if err != nil {
			return nil, fmt.Errorf("pockettts: voice state: %s/cache: %w", name, err)
		}
		per := int(c.Shape[2]) * heads * hd
		used := v.Positions * heads * hd
		k, val := vals[:used:used], vals[per:per+used:per+used]
		if j := slices.IndexFunc(k, notFinite); j >= 0 {
			return nil, fmt.Errorf("pockettts: voice state: %s: key %d is %v", name, j, k[j])
		}
		if j := slices.IndexFunc(val, notFinite); j >= 0 {
			return nil, fmt.Errorf("pockettts: voice state: %s: value %d is %v", name, j, val[j])
		}
		v.Layers[i] = VoiceLayer{K: slices.Clone(k), V: slices.Clone(val)}
	}
	return v, nil
}

func notFinite(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }

// WriteSafetensors writes v in upstream's export_model_state layout (cache of exactly
// Positions, offset as I64).
func (v *Voice) WriteSafetensors(w io.Writer, cfg *Config) error {
	st := safetensors.NewWriter()
	for i, l := range v.Layers {
		name := fmt.Sprintf("%s%d.self_attn", voiceModule, i)
		cache := append(slices.Clone(l.K), l.V...)
		if err := st.AddFloat32(name+"/cache", []int64{2, 1, int64(v.Positions), int64(cfg.Heads), int64(cfg.HeadDim())}, cache); err != nil {
			return err
		}
		if err := st.AddInt64(name+"/offset", []int64{1}, []int64{int64(v.Positions)}); err != nil {
			return err
		}
	}
	_, err := st.WriteTo(w)
	return err
}
