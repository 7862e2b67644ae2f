package pockettts

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/kvcache"
)

// batchSpec is one synthesis of a batched run: its voice, its text, the step it joins at, its
// frame count, its decoder slot and its noise (a row per frame).
type batchSpec struct {
	voice         *Voice
	tokens        []int32
	start, frames int
	slot          int
	noise         []float32
}

// batchOut is what one synthesis of a run produced, frame by frame.
type batchOut struct{ lat, eos, audio []float32 }

// truncVoice is v's first n positions: a voice state of another length.
func truncVoice(v *Voice, n int) *Voice {
	t := &Voice{Positions: n}
	for _, l := range v.Layers {
		w := len(l.K) / v.Positions
		t.Layers = append(t.Layers, VoiceLayer{K: l.K[:n*w], V: l.V[:n*w]})
	}
	return t
}

// runBatched steps specs together, free-running (each step reads the synthesis's previous
// latent): at each step the syntheses joining it get their voice, a decoder reset and their text
// passes (one Text call), then every synthesis in flight takes one frame step (one Step call, the
// latest joined first) and its frame is decoded (one decoder Step call). With start, the
// syntheses joining a step take their text passes and first frame steps in one Start call
// instead, and the others one Step call.
func runBatched(t *testing.T, f *FlowLM, dec *Decoder, specs []batchSpec, start bool) []batchOut {
	t.Helper()
	cfg := &f.m.cfg
	L, F := cfg.LatentDim, cfg.FrameSamples()
	outs := make([]batchOut, len(specs))
	seqs := make([]*kvcache.Seq, len(specs))
	ins := make([][]float32, len(specs))
	end := 0
	for _, s := range specs {
		end = max(end, s.start+s.frames)
	}
	for step := range end {
		var tseqs []*kvcache.Seq
		var toks [][]int32
		for i, s := range specs {
			if s.start != step {
				continue
			}
			seqs[i] = f.Pool().NewSeq(0)
			if err := f.SetVoice(seqs[i], s.voice); err != nil {
				t.Fatal(err)
			}
			if err := dec.Reset(s.slot); err != nil {
				t.Fatal(err)
			}
			ins[i] = make([]float32, L)
			for j := range ins[i] {
				ins[i][j] = float32(math.NaN())
			}
			tseqs, toks = append(tseqs, seqs[i]), append(toks, s.tokens)
		}
		if len(tseqs) > 0 && !start {
			if err := f.Text(tseqs, toks); err != nil {
				t.Fatal(err)
			}
		}
		var sidx, idx, slots []int
		var sout, seos, snoise []float32
		if start && len(tseqs) > 0 {
			for i, s := range specs {
				if s.start == step {
					sidx, slots = append(sidx, i), append(slots, s.slot)
					snoise = append(snoise, s.noise[:L]...)
				}
			}
			sout, seos = make([]float32, len(sidx)*L), make([]float32, len(sidx))
			if err := f.Start(tseqs, toks, snoise, sout, seos); err != nil {
				t.Fatal(err)
			}
		}
		var bseqs []*kvcache.Seq
		var in, noise []float32
		for i := len(specs) - 1; i >= 0; i-- {
			s := specs[i]
			if start && s.start == step {
				continue // Start took its step
			}
			if k := step - s.start; k >= 0 && k < s.frames {
				idx, slots, bseqs = append(idx, i), append(slots, s.slot), append(bseqs, seqs[i])
				in = append(in, ins[i]...)
				noise = append(noise, s.noise[k*L:(k+1)*L]...)
			}
		}
		n := len(idx)
		out, eos := make([]float32, n*L), make([]float32, n)
		if err := f.Step(bseqs, in, noise, out, eos); err != nil {
			t.Fatal(err)
		}
		idx, out, eos = append(sidx, idx...), append(sout, out...), append(seos, eos...)
		audio := make([]float32, len(idx)*F)
		if len(idx) == 0 {
			continue
		}
		if err := dec.Step(slots, out, audio); err != nil {
			t.Fatal(err)
		}
		for r, i := range idx {
			o := &outs[i]
			o.lat = append(o.lat, out[r*L:(r+1)*L]...)
			o.eos = append(o.eos, eos[r])
			o.audio = append(o.audio, audio[r*F:(r+1)*F]...)
			copy(ins[i], out[r*L:(r+1)*L])
			if step == specs[i].start+specs[i].frames-1 {
				seqs[i].Release()
			}
		}
	}
	return outs
}

// TestBatchedMatchesAlone: syntheses with different voices (lengths), texts and frame counts,
// joining and leaving mid-way, stepped together through the FlowLM (one Step over all, per
// sequence attention), the flow head and the decoder (slots taken over by a later synthesis),
// give each synthesis what it gives stepped alone from a fresh state, within the parity tests'
// F32 bounds (1e-4 of the largest magnitude; 1e-4 absolute on the waveform); and so do they
// when the syntheses joining a step take their text passes and first frame steps in one pass
// (Start) beside the others' frame step.
func TestBatchedMatchesAlone(t *testing.T) {
	for _, be := range sharedtest.Backends(t, 2) {
		t.Run(be.Name(), func(t *testing.T) {
			if raceEnabled && be.Name() != "cpu" {
				t.Skip("a batched run takes minutes under the race detector here; the cpu backend runs it")
			}
			p := newParityModel(t, be)
			cfg := &p.m.cfg
			f, err := p.m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: 3, KVSlots: 1024})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			dec, err := p.m.NewDecoder(3)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dec.Close() })
			voice := refVoice(t, cfg)
			rng := rand.New(rand.NewPCG(7, 11))
			tokens := func(n int) []int32 {
				ids := make([]int32, n)
				for i := range ids {
					ids[i] = int32(rng.IntN(cfg.Vocab))
				}
				return ids
			}
			noise := func(frames int) []float32 {
				x := make([]float32, frames*cfg.LatentDim)
				for i := range x {
					x[i] = float32(rng.NormFloat64() * 0.8)
				}
				return x
			}
			// A runs throughout; B and C join at step 2; C leaves at step 4 and D joins at step 6
			// in C's decoder slot, after A has left.
			specs := []batchSpec{
				{voice: voice, tokens: tokens(12), start: 0, frames: 6, slot: 2},
				{voice: truncVoice(voice, 20), tokens: tokens(30), start: 2, frames: 5, slot: 0},
				{voice: voice, tokens: tokens(5), start: 2, frames: 3, slot: 1},
				{voice: truncVoice(voice, 9), tokens: tokens(8), start: 6, frames: 3, slot: 1},
			}
			for i := range specs {
				specs[i].noise = noise(specs[i].frames)
			}
			batched := runBatched(t, f, dec, specs, false)
			started := runBatched(t, f, dec, specs, true)
			for i, s := range specs {
				s.start, s.slot = 0, 0
				alone := runBatched(t, f, dec, []batchSpec{s}, false)[0]
				for _, r := range []struct {
					how string
					b   batchOut
				}{{"", batched[i]}, {" (Start)", started[i]}} {
					name := fmt.Sprintf("synthesis %c%s", 'A'+i, r.how)
					check(t, name+" latents", r.b.lat, alone.lat, parityTol, false)
					check(t, name+" eos", r.b.eos, alone.eos, parityTol, false)
					check(t, name+" audio", r.b.audio, alone.audio, parityWaveTol, true)
				}
			}
			if f.Pool().FreeBlocks() != f.Pool().Blocks() {
				t.Errorf("%d of %d cache blocks still held", f.Pool().Blocks()-f.Pool().FreeBlocks(), f.Pool().Blocks())
			}
		})
	}
}
