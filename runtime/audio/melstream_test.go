package audio

import (
	"math"
	"math/rand/v2"
	"testing"
)

// streamMel runs samples through a MelStream in pieces of random sizes, reading frames into
// buffers of random sizes, and returns its frames ([Frames(), nMel], frame-major) and Max.
func streamMel(t *testing.T, samples []float32, f MelFilters, threads int, rng *rand.Rand) ([]float32, int, float32) {
	t.Helper()
	ms, err := NewMelStream(f, threads)
	if err != nil {
		t.Fatal(err)
	}
	var frames []float32
	dst := make([]float32, 700*f.NMel)
	read := func() {
		for {
			k := ms.Read(dst[:(1+rng.IntN(700))*f.NMel])
			if k == 0 {
				return
			}
			frames = append(frames, dst[:k*f.NMel]...)
		}
	}
	for at := 0; at < len(samples); {
		n := min(len(samples)-at, 1+rng.IntN(40000))
		if rng.IntN(4) == 0 {
			n = min(len(samples)-at, 1+rng.IntN(300))
		}
		ms.Write(samples[at : at+n])
		at += n
		read()
	}
	ms.End()
	read()
	if ms.Next() != ms.Frames() || len(frames) != ms.Frames()*f.NMel || ms.Samples() != len(samples) {
		t.Fatalf("%d samples: read %d frames, next %d, Frames %d", len(samples), len(frames)/f.NMel, ms.Next(), ms.Frames())
	}
	return frames, ms.Frames(), ms.Max()
}

// TestMelStreamEqualsLogMel: the frames of a MelStream, written and read in pieces of any size on
// any number of threads, with MelFloor for the silence after them and clamped at its Max, are
// LogMel's bit for bit, for clips from no samples to more than two 30 s windows.
func TestMelStreamEqualsLogMel(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	filters := []MelFilters{randomFilters(13, 1), randomFilters(80, 2)}
	for _, n := range []int{0, 1, 150, 200, 201, 359, 360, 399, 401, 12345, 3*SampleRate + 77, 65*SampleRate + 123} {
		for fi, f := range filters {
			if n > 10*SampleRate && fi == 0 {
				continue
			}
			samples := testSignal(n, uint64(n)+1)
			want, nFrames, err := LogMel(samples, f, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, threads := range []int{1, 3} {
				frames, nc, top := streamMel(t, samples, f, threads, rng)
				got := make([]float32, f.NMel*nFrames) // [nMel, nFrames], as LogMel's
				for j := 0; j < f.NMel; j++ {
					for i := 0; i < nFrames; i++ {
						v := float32(MelFloor)
						if i < nc {
							v = frames[i*f.NMel+j]
						}
						got[j*nFrames+i] = v
					}
				}
				ClampMel(got, top)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d filters %d threads %d: bin %d frame %d is %v, LogMel's %v", n, fi, threads, i/nFrames, i%nFrames, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestMelStreamSkip: after Skip, Read goes on with the frames a stream that computed the skipped
// ones would have read, and Max counts only the frames computed.
func TestMelStreamSkip(t *testing.T) {
	f := randomFilters(80, 5)
	samples := testSignal(7*SampleRate+5, 6)
	all, nc, _ := streamMel(t, samples, f, 2, rand.New(rand.NewPCG(1, 1)))
	for _, to := range []int{1, 2, 3, 250, 699, nc - 1, nc, nc + 5} {
		ms, err := NewMelStream(f, 2)
		if err != nil {
			t.Fatal(err)
		}
		ms.Write(samples[:len(samples)/3])
		if got := ms.Skip(to); got != to {
			t.Fatalf("Skip(%d) = %d", to, got)
		}
		ms.Write(samples[len(samples)/3:])
		ms.End()
		dst := make([]float32, nc*f.NMel)
		k := ms.Read(dst)
		if want := max(0, nc-to); k != want {
			t.Fatalf("after Skip(%d): %d frames, want %d", to, k, want)
		}
		top := float32(MelFloor)
		for i := range dst[:k*f.NMel] {
			if math.Float32bits(dst[i]) != math.Float32bits(all[to*f.NMel+i]) {
				t.Fatalf("after Skip(%d): value %d differs", to, i)
			}
			top = max(top, dst[i])
		}
		if ms.Max() != top {
			t.Errorf("after Skip(%d): Max %v, want %v (the frames computed)", to, ms.Max(), top)
		}
	}
}

// TestMelStreamHoldsLittle: a stream read as it is written holds the samples of the frames still
// to come and the piece last written, not the recording.
func TestMelStreamHoldsLittle(t *testing.T) {
	f := randomFilters(80, 7)
	ms, err := NewMelStream(f, 1)
	if err != nil {
		t.Fatal(err)
	}
	piece := testSignal(SampleRate, 8)
	dst := make([]float32, 200*f.NMel)
	for range 600 { // 10 minutes
		ms.Write(piece)
		for ms.Read(dst) > 0 {
		}
		if len(ms.buf) > 2*len(piece)+FrameLength {
			t.Fatalf("after %d samples the stream holds %d", ms.Samples(), len(ms.buf))
		}
	}
}
