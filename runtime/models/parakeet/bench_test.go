package parakeet

import (
	"os"
	"strconv"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// benchModel is the file the benchmarks measure: $PARLEY_PARAKEET_BENCH_MODEL, else the 0.6b-v2
// random-weight F16 model (see sharedtest.ParakeetRandomModel).
func benchModel(b *testing.B) string {
	if p := os.Getenv("PARLEY_PARAKEET_BENCH_MODEL"); p != "" {
		return p
	}
	return sharedtest.ParakeetRandomModel(b, "0.6b-v2", true)
}

// benchBackend is the native CPU backend with two threads (the pure-Go one where it is absent).
func benchBackend(b *testing.B) backend.Backend {
	for _, name := range []string{"cpu", "purego"} {
		if be, _, err := backend.New(name, backend.Options{Threads: 2}); err == nil {
			b.Cleanup(func() { be.Close() })
			return be
		}
	}
	b.Skip("no host backend")
	return nil
}

// benchMel is the log-mel of jfk.wav (11 s).
func benchMel(b *testing.B, m *Model) []float32 {
	data, err := os.ReadFile(sharedtest.Path(b, "data/asr/wav/jfk.wav"))
	if err != nil {
		b.Fatal(err)
	}
	pcm, _, err := audio.Decode(data)
	if err != nil {
		b.Fatal(err)
	}
	mel, err := m.FrontEnd.LogMel(nil, pcm)
	if err != nil {
		b.Fatal(err)
	}
	return mel
}

// BenchmarkLoad opens the model file and loads its weights onto the backend.
func BenchmarkLoad(b *testing.B) {
	path, be := benchModel(b), benchBackend(b)
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		m, err := Load(f, be)
		if err != nil {
			b.Fatal(err)
		}
		m.Close()
		f.Close()
	}
}

// BenchmarkEncode runs the encoder and the joint's encoder projection on jfk.wav's 11 s.
func BenchmarkEncode(b *testing.B) {
	f, err := Open(benchModel(b))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m, err := Load(f, benchBackend(b))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	mel := benchMel(b, m)
	rows := len(mel) / m.HParams.NMels
	enc, err := m.NewEncoder(rows, EncoderFrames(rows))
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	be := m.Backend()
	proj, err := be.Alloc(tensor.F32, EncoderFrames(rows), m.HParams.NPredDim)
	if err != nil {
		b.Fatal(err)
	}
	defer proj.Close()
	for b.Loop() {
		out, err := enc.Encode([][]float32{mel})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.ProjectEncoder(proj, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJoint computes one joint row of each of n streams (n encoder projections, n slots):
// "calls" a Joint call per stream, "multi" one JointMulti call of n groups.
func BenchmarkJoint(b *testing.B) {
	f, err := Open(benchModel(b))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m, err := Load(f, benchBackend(b))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	const streams, frames = 4, 50
	be, P := m.Backend(), m.HParams.NPredDim
	d, err := m.NewDecoder(streams, streams)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	tok, from, to := make([]int32, streams), make([]int32, streams), make([]int32, streams)
	for i := range streams {
		tok[i], from[i], to[i] = int32(m.HParams.NVocab), -1, int32(i)
	}
	if err := d.Predict(tok, from, to); err != nil {
		b.Fatal(err)
	}
	vals := make([]float32, frames*P)
	for i := range vals {
		vals[i] = float32(i%17) / 17
	}
	groups := make([]JointGroup, streams)
	frame, slot := make([]int32, streams), make([]int32, streams)
	for i := range streams {
		t, err := be.Alloc(tensor.F32, frames, P)
		if err != nil {
			b.Fatal(err)
		}
		defer t.Close()
		if err := be.Write(t, 0, vals); err != nil {
			b.Fatal(err)
		}
		frame[i], slot[i] = int32(7*i%frames), int32(i)
		groups[i] = JointGroup{Enc: t, Frames: frame[i : i+1], Slots: slot[i : i+1]}
	}
	dst := make([]float32, streams*d.Width())
	for _, n := range []int{1, streams} {
		b.Run("streams="+strconv.Itoa(n)+"/calls", func(b *testing.B) {
			for b.Loop() {
				for i := range n {
					g := groups[i]
					if err := d.Joint(dst[i*d.Width():], g.Enc, g.Frames, g.Slots); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("streams="+strconv.Itoa(n)+"/multi", func(b *testing.B) {
			for b.Loop() {
				if err := d.JointMulti(dst, groups[:n]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
