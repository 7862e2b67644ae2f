package asr

import (
	"context"
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// openParakeetSmall starts a Parakeet scheduler over the small random-weight model on the first
// backend under test, closed when t ends.
func openParakeetSmall(t testing.TB, cfg Config) *Parakeet {
	t.Helper()
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	m, err := parakeet.Load(f, sharedtest.Backends(t, 2)[0])
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	e, err := NewParakeet(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		m.Close()
		f.Close()
	})
	return e
}

// streamTokens streams pcm through a live stream of e configured by cfg, in writes of step
// samples, and returns every token it decoded (no endpoints) before its final.
func streamTokens(t testing.TB, e *Parakeet, cfg SessionConfig, pcm []float32, step int) []parakeet.Token {
	t.Helper()
	cfg.Silence = -1
	l, err := e.NewLive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := l.(*pstream)
	ctx := context.Background()
	for i := 0; i < len(pcm); i += step {
		if _, err := s.Write(ctx, pcm[i:min(i+step, len(pcm))]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.flush(ctx); err != nil {
		t.Fatal(err)
	}
	toks := append([]parakeet.Token(nil), s.toks...)
	e.vocab.Transcript(toks) // their times
	return toks
}

func editDistance(a, b []int32) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// encodeFrames returns the encoder output of pcm, one row per frame.
func encodeFrames(t testing.TB, m *parakeet.Model, pcm []float32) [][]float32 {
	t.Helper()
	mel, err := m.FrontEnd.LogMel(nil, pcm)
	if err != nil {
		t.Fatal(err)
	}
	rows := len(mel) / m.HParams.NMels
	enc, err := m.NewEncoder(rows, parakeet.EncoderFrames(rows))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	out, err := enc.Encode([][]float32{mel})
	if err != nil {
		t.Fatal(err)
	}
	d := m.HParams.NAudioState
	flat := make([]float32, out.Rows()*d)
	if err := m.Backend().Read(out, 0, flat); err != nil {
		t.Fatal(err)
	}
	res := make([][]float32, out.Rows())
	for i := range res {
		res[i] = flat[i*d : (i+1)*d]
	}
	return res
}

// chunkedError is the relative RMS difference between the encoder frames of pcm encoded whole and
// encoded in chunks of chunk samples with left and right samples of context around each, the
// chunk's own frames kept.
func chunkedError(t testing.TB, m *parakeet.Model, pcm []float32, chunk, left, right int) float64 {
	whole := encodeFrames(t, m, pcm)
	var num, den float64
	for next := 0; next+chunk <= len(pcm); next += chunk {
		w0, w1 := max(0, next-left), min(len(pcm), next+chunk+right)
		got := encodeFrames(t, m, pcm[w0:w1])
		skip := (next - w0) / frameSamplesEnc
		for f := 0; f < chunk/frameSamplesEnc; f++ {
			for c, v := range whole[next/frameSamplesEnc+f] {
				dv := float64(got[skip+f][c] - v)
				num += dv * dv
				den += float64(v) * float64(v)
			}
		}
	}
	return math.Sqrt(num / den)
}

// offlineTokens transcribes pcm with e and returns its tokens.
func offlineTokens(t testing.TB, e *Parakeet, pcm []float32) []Token {
	t.Helper()
	res, err := e.Transcribe(context.Background(), pcm, DefaultParams(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var toks []Token
	for _, s := range res.Segments {
		toks = append(toks, s.Tokens...)
	}
	return toks
}

// TestParakeetStreamWholeContext: a stream whose left context covers all it has heard and whose
// right context covers the rest (every chunk decoded at Commit from the whole recording's
// encoding) decodes the offline transcription's tokens exactly (ids, times, probabilities),
// although its decoder stops at every chunk's end and goes on from its saved state; in writes
// of 100 ms and in one write. With the default context the encoding differs, and the tokens with
// it; their edit distance to the offline ones is logged.
func TestParakeetStreamWholeContext(t *testing.T) {
	e := openParakeetSmall(t, Config{MaxActive: 2})
	clips := []string{"jfk", "ami-ES2011a-headset0-40s-46s"}
	if !raceEnabled {
		clips = append(clips, "psx-librivox-0870")
	}
	whole := SessionConfig{LeftContext: maxContext, RightContext: maxContext}
	for _, clip := range clips {
		pcm := testWAV(t, clip)
		want := offlineTokens(t, e, pcm)
		if len(want) < 5 {
			t.Fatalf("%s: %d tokens offline: too few to compare", clip, len(want))
		}
		for _, step := range []int{SampleRate / 10, len(pcm)} {
			got := streamTokens(t, e, whole, pcm, step)
			if len(got) != len(want) {
				t.Fatalf("%s (writes of %d): %d tokens, offline %d", clip, step, len(got), len(want))
			}
			for i, w := range want {
				g := got[i]
				if g.ID != w.ID || float64(g.T0)/100 != w.T0 || float64(g.T1)/100 != w.T1 || g.P != w.P || g.PLog != w.PLog {
					t.Fatalf("%s (writes of %d): token %d is %+v, offline %+v", clip, step, i, g, w)
				}
			}
		}
		got := streamTokens(t, e, SessionConfig{}, pcm, SampleRate/10)
		a, b := make([]int32, len(got)), make([]int32, len(want))
		for i := range got {
			a[i] = got[i].ID
		}
		for i := range want {
			b[i] = want[i].ID
		}
		t.Logf("%s: default context: %d tokens, edit distance %d to the %d offline", clip, len(a), editDistance(a, b), len(b))
	}
}

// TestParakeetChunkedEncoding measures what finite context changes: the relative RMS
// difference between the encoder frames of a recording encoded whole and encoded by chunks
// (1.6 s, 480 ms of right context) as the stream encodes them. With 4 s of left context it is
// about 0.21 on jfk (the per-window feature normalisation and the missing context; random
// weights amplify both); with 1 s, about 0.6. Misplaced frames would give more than 1.
func TestParakeetChunkedEncoding(t *testing.T) {
	e := openParakeetSmall(t, Config{MaxActive: 1})
	pcm := testWAV(t, "jfk")
	chunk, right := 20*frameSamplesEnc, 6*frameSamplesEnc
	short := chunkedError(t, e.m, pcm, chunk, SampleRate, right)
	def := chunkedError(t, e.m, pcm, chunk, 4*SampleRate, right)
	t.Logf("relative RMS error of the encoder frames: left 1 s %.3f, 4 s %.3f", short, def)
	if def > 0.3 || short < 2*def {
		t.Errorf("relative RMS error of the encoder frames with 4 s of left context %.3f (want at most 0.3), with 1 s %.3f (want over twice that)", def, short)
	}
}
