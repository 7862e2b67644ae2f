package parakeet

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestColRows: colRows(n, c) rows of c values hold n rows of 9 exactly, and are the fewest that do.
func TestColRows(t *testing.T) {
	for _, c := range []int{4, 9, 16, 64, 256} {
		for n := 1; n < 300; n++ {
			r := colRows(n, c)
			if r*c < 9*n || r*c%9 != 0 {
				t.Fatalf("colRows(%d, %d) = %d", n, c, r)
			}
			for s := r - 1; s*c >= 9*n; s-- {
				if s*c%9 == 0 {
					t.Fatalf("colRows(%d, %d) = %d, but %d rows do", n, c, r, s)
				}
			}
		}
	}
}

// TestEncoderScratch encodes random clips with the shape of whisper.cpp's test model, whose few
// channels leave conv0's receptive fields no room in the subsampling's second buffer (a tensor
// of their own), and with a shape where they fit there: on every backend, a clip gives the same
// finite output alone and after a longer clip in the same encoder, and two clips in one call
// give each its output alone.
func TestEncoderScratch(t *testing.T) {
	wide := quantHP
	wide.NSubsamplingChannels = 64
	for _, h := range []HParams{tinyHP, wide} {
		f := synthFile(t, h, 5)
		for _, l := range f.Weights.Layers { // a batch norm's variance is positive
			for i := 0; i < len(l.BNVar.Data); i += 4 {
				binary.LittleEndian.PutUint32(l.BNVar.Data[i:], math.Float32bits(0.5+float32(i%7)/4))
			}
		}
		rng := rand.New(rand.NewPCG(3, 4))
		mel := func(rows int) []float32 {
			m := make([]float32, rows*h.NMels)
			for i := range m {
				m[i] = float32(rng.NormFloat64())
			}
			return m
		}
		long, short := mel(61), mel(37)
		for _, be := range sharedtest.Backends(t, 2) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := m.NewEncoder(61, EncoderFrames(61)+EncoderFrames(37))
			if err != nil {
				t.Fatal(err)
			}
			if (enc.cols0 != nil) != (h == tinyHP) {
				t.Errorf("%s: conv0's receptive fields in a tensor of their own: %v", be.Name(), enc.cols0 != nil)
			}
			run := func(mels ...[]float32) []float32 {
				out, err := enc.Encode(mels)
				if err != nil {
					t.Fatal(err)
				}
				v := make([]float32, out.Rows()*out.Cols())
				if err := be.Read(out, 0, v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			alone := run(short)
			run(long)
			again := run(short)
			both := run(long, short)
			tail := both[len(both)-len(alone):]
			for i := range alone {
				if math.IsNaN(float64(alone[i])) || math.IsInf(float64(alone[i]), 0) {
					t.Fatalf("%s %d: output %d is %v", be.Name(), h.NAudioState, i, alone[i])
				}
				if again[i] != alone[i] || math.Abs(float64(tail[i]-alone[i])) > 1e-4*(1+math.Abs(float64(alone[i]))) {
					t.Fatalf("%s %d: output %d: %v alone, %v after a longer clip, %v beside it", be.Name(), h.NAudioState, i, alone[i], again[i], tail[i])
				}
			}
			enc.Close()
			m.Close()
		}
	}
}
