package whisper

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/audio"
)

// TestSilenceGate: audio whose peak stays under silenceLevel (digital zeros, or noise at -61
// dBFS) is not decoded: the transcription is empty text over the audio's duration, where a
// random-weight model decoding it would make text up.
func TestSilenceGate(t *testing.T) {
	e, err := NewEngine(testModel(t, "tiny.en"), EngineConfig{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := DefaultParams()
	p.TemperatureInc, p.MaxTokens = 0, 8
	rng := rand.New(rand.NewPCG(5, 5))
	noise := make([]float32, 12*SampleRate)
	for i := range noise {
		noise[i] = float32(rng.Float64()*2-1) * 0.9 * silenceLevel
	}
	for _, c := range []struct {
		name    string
		samples []float32
	}{{"zeros", make([]float32, 5*SampleRate)}, {"noise under the gate", noise}} {
		res, err := e.Transcribe(context.Background(), c.samples, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(len(c.samples)) / SampleRate; res.Text != "" || len(res.Segments) != 0 || res.Segments == nil || res.Duration != want || res.Language != "en" {
			t.Errorf("%s: %q in %d segments over %.2f s (%q), want empty text over %.2f s", c.name, res.Text, len(res.Segments), res.Duration, res.Language, want)
		}
	}
	if st := e.Stats(); st.LastBatchSeqs != 0 {
		t.Errorf("the decoder ran: %+v", st)
	}
}

// TestSilenceGateWindows: the gate skips each 30 s window from seek on that is silent to its end
// or to the end of the audio, and no window with a loud sample.
func TestSilenceGateWindows(t *testing.T) {
	const sec = SampleRate
	pcm := func(n int, loud ...int) []float32 { // n s of zeros but for a sample at each of loud
		s := make([]float32, n*sec)
		for _, i := range loud {
			s[i] = -silenceLevel
		}
		return s
	}
	cases := []struct {
		name      string
		samples   []float32
		seek      int // where the window to decode begins (mel frames)
		want      int // where the gate leaves seek (when done, the end of the content: 499 frames for 5 s, 6999 for 70 s)
		wantDone  bool
		wantFirst bool // a window is left at the start
	}{
		{"silent", pcm(5), 0, 499, true, false},
		{"one loud sample", pcm(5, 4*sec), 0, 0, false, true},
		{"loud, then silent to the end", pcm(70, 9*sec), 3000, 6999, true, true},
		{"loud, silent for a window, loud", pcm(70, 9*sec, 65*sec), 3000, 6000, false, true},
		{"loud, silent for two windows, loud", pcm(100, 9*sec, 95*sec), 3000, 9000, false, true},
		{"loud at a window's last hop", pcm(70, 9*sec, 60*sec-1), 3000, 3000, false, true},
		{"loud at the next window's first", pcm(70, 9*sec, 60*sec), 3000, 6000, false, true},
		{"silent up to the last window", pcm(70, 61*sec), 0, 6000, false, false},
	}
	for _, c := range cases {
		j := &job{}
		j.seekEnd = audio.MelContentFrames(len(c.samples))
		j.gateSilence(c.samples)
		if got := j.ph != phDone && j.seek == 0; got != c.wantFirst {
			t.Errorf("%s: window at the start to decode: %v (seek %d), want %v", c.name, got, j.seek, c.wantFirst)
		}
		if c.wantFirst {
			j.seek = c.seek
			j.skipSilence()
		}
		if j.seek != c.want || (j.ph == phDone) != c.wantDone {
			t.Errorf("%s: seek %d, done %v; want %d, %v", c.name, j.seek, j.ph == phDone, c.want, c.wantDone)
		}
	}
}

// TestEmitStartAfterEnd: a window whose first token is text starts its first segment at that
// token's most probable timestamp, which may come after the timestamp ending the segment; the
// segment then starts at its end, and a segment in order is left as whisper.cpp has it.
func TestEmitStartAfterEnd(t *testing.T) {
	e := manualEngine(t, testModel(t, "tiny.en"), EngineConfig{MaxActive: 1})
	defer func() { e.dec.Close(); e.enc.Close() }()
	beg := e.tok.TimestampBegin
	text := e.tok.Encode(" Hello")
	for _, c := range []struct {
		guess, ts  int32 // the text token's most probable timestamp, the timestamp after it
		start, end float64
	}{{16, 10, 0.2, 0.2}, {5, 10, 0.1, 0.2}, {10, 10, 0.2, 0.2}} {
		j := &job{p: DefaultParams(), temps: []float32{0}, nSamples: 10 * SampleRate, seekEnd: 1000}
		var toks []tokData
		for _, id := range text {
			toks = append(toks, tokData{id: id, tid: beg + c.guess})
		}
		toks = append(toks, tokData{id: beg + c.ts, tid: beg + c.ts})
		e.emit(j, &hyp{tokens: toks, seekDelta: 1000})
		if len(j.segments) != 1 {
			t.Fatalf("%d segments, want 1", len(j.segments))
		}
		s := j.segments[0]
		if s.Start != c.start || s.End != c.end {
			t.Errorf("text at <|%.2f|> then <|%.2f|>: segment [%.2f, %.2f], want [%.2f, %.2f]", float64(c.guess)*0.02, float64(c.ts)*0.02, s.Start, s.End, c.start, c.end)
		}
		for i, tk := range s.Tokens {
			if tk.T1 < tk.T0 || tk.T0 < s.Start || tk.T1 > s.End || (i > 0 && tk.T0 < s.Tokens[i-1].T1) {
				t.Errorf("token %d times [%.2f, %.2f] in [%.2f, %.2f]", i, tk.T0, tk.T1, s.Start, s.End)
			}
		}
	}
}

// TestNonFiniteSamples: a NaN or infinite sample is the caller's mistake (ErrBadRequest), not a
// failure of the model's arithmetic.
func TestNonFiniteSamples(t *testing.T) {
	e, err := NewEngine(testModel(t, "tiny.en"), EngineConfig{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		s := make([]float32, 2*SampleRate)
		s[1234] = v
		if _, err := e.Transcribe(context.Background(), s, DefaultParams(), nil); !errors.Is(err, ErrBadRequest) {
			t.Errorf("a sample of %v: %v, want ErrBadRequest", v, err)
		}
	}
}
