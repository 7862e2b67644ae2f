package asr

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
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its results; the recogniser's goroutines run in the concurrency tests")
	}
	e, err := NewWhisper(testModel(t, "tiny.en"), Config{MaxActive: 1})
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
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser with no goroutine of its own (noLoop)")
	}
	e := manualWhisper(t, testModel(t, "tiny.en"), Config{MaxActive: 1})
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
	e, err := NewWhisper(testModel(t, "tiny.en"), Config{MaxActive: 1})
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

// windowTokens is a window's result as emit takes it: text, then a timestamp token (at ts, in
// 20 ms steps), for each of texts in turn; every text token's most probable timestamp is beg.
func windowTokens(e *Whisper, texts []string, ts []int32) []tokData {
	beg := e.tok.TimestampBegin
	toks := []tokData{{id: beg, tid: beg}}
	for i, text := range texts {
		if i > 0 { // the next segment begins where the last ended
			toks = append(toks, tokData{id: beg + ts[i-1], tid: beg + ts[i-1]})
		}
		for _, id := range e.tok.Encode(text) {
			toks = append(toks, tokData{id: id, tid: beg})
		}
		toks = append(toks, tokData{id: beg + ts[i], tid: beg + ts[i]})
	}
	return toks
}

// TestInterpolateTextTokens: a segment's time is shared out over its text tokens alone: they
// cover the segment from start to end, in proportion to their bytes, and its timestamp tokens
// (whose pieces, "[_TT_50]", are not speech) take no time, at its start or end.
func TestInterpolateTextTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser with no goroutine of its own (noLoop)")
	}
	e := manualWhisper(t, testModel(t, "tiny.en"), Config{MaxActive: 1})
	defer func() { e.dec.Close(); e.enc.Close() }()
	j := &job{p: DefaultParams(), temps: []float32{0}, nSamples: 10 * SampleRate, seekEnd: 1000}
	e.emit(j, &hyp{tokens: windowTokens(e, []string{" Hello world", " Good night"}, []int32{50, 100}), seekDelta: 1000})
	if len(j.segments) != 2 {
		t.Fatalf("%d segments, want 2", len(j.segments))
	}
	for _, s := range j.segments {
		bytes, nText := 0, 0
		for _, tk := range s.Tokens {
			if tk.ID < e.tok.EOT {
				bytes += len(tk.Text)
			}
		}
		at := s.Start
		for i, tk := range s.Tokens {
			if tk.ID >= e.tok.EOT {
				if tk.T0 != tk.T1 || (tk.T0 != s.Start && tk.T0 != s.End) || (nText > 0 && tk.T0 != s.End) {
					t.Errorf("segment %q: special token %d (%q) at %v-%v, want no time at the segment's start %v or end %v", s.Text, i, tk.Text, tk.T0, tk.T1, s.Start, s.End)
				}
				continue
			}
			nText++
			want := float64(len(tk.Text)) / float64(bytes) * (s.End - s.Start)
			if math.Abs(tk.T0-at) > 1e-9 || math.Abs(tk.T1-tk.T0-want) > 1e-9 {
				t.Errorf("segment %q [%v, %v]: token %q at %v-%v, want %v long from %v", s.Text, s.Start, s.End, tk.Text, tk.T0, tk.T1, want, at)
			}
			at = tk.T1
		}
		if at != s.End || nText == 0 {
			t.Errorf("segment %q [%v, %v]: its text ends at %v", s.Text, s.Start, s.End, at)
		}
	}
}

// TestWindowCompressionRatio: every segment of a window reports the window's compression ratio,
// the one the fallback judged, as OpenAI's verbose_json does, not one of its own text.
func TestWindowCompressionRatio(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a hand-stepped recogniser with no goroutine of its own (noLoop)")
	}
	e := manualWhisper(t, testModel(t, "tiny.en"), Config{MaxActive: 1})
	defer func() { e.dec.Close(); e.enc.Close() }()
	j := &job{p: DefaultParams(), temps: []float32{0}, nSamples: 10 * SampleRate, seekEnd: 1000}
	texts := []string{" The quick brown fox.", " Again and again and again and again and again and again."}
	e.emit(j, &hyp{tokens: windowTokens(e, texts, []int32{100, 300}), seekDelta: 1000})
	want := e.ratio.Ratio(texts[0] + texts[1])
	if len(j.segments) != 2 || e.ratio.Ratio(texts[0]) == e.ratio.Ratio(texts[1]) {
		t.Fatalf("%d segments; the test wants two of different ratios", len(j.segments))
	}
	for _, s := range j.segments {
		if s.CompressionRatio != want {
			t.Errorf("segment %q: compression ratio %v, want the window's %v", s.Text, s.CompressionRatio, want)
		}
	}
}

// TestSilenceLanguage: a multilingual model detects the language of audio it does not decode
// (silence, or too short a clip), as it would for the first window of a decode, so that the
// result always names one; a language asked for is reported as asked.
func TestSilenceLanguage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its results; the recogniser's goroutines run in the concurrency tests")
	}
	e, err := NewWhisper(testModel(t, "tiny"), Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := DefaultParams()
	p.TemperatureInc, p.MaxTokens = 0, 8
	zeros := make([]float32, 10*SampleRate)
	probs, err := e.DetectLanguage(context.Background(), zeros)
	if err != nil {
		t.Fatal(err)
	}
	best := probs[0]
	for _, lp := range probs {
		if lp.P > best.P {
			best = lp
		}
	}
	for _, c := range []struct {
		name    string
		samples []float32
		lang    string
		want    string
	}{
		{"10 s of zeros", zeros, "", best.Code},
		{"10 s of zeros, auto", zeros, "auto", best.Code},
		{"50 ms of sound", tone(800), "", ""},
		{"10 s of zeros in German", zeros, "de", "de"},
	} {
		p.Language = c.lang
		res, err := e.Transcribe(context.Background(), c.samples, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Language == "" || (c.want != "" && res.Language != c.want) || len(res.Segments) != 0 {
			t.Errorf("%s: language %q, %d segments; want %q, none", c.name, res.Language, len(res.Segments), c.want)
		}
	}
}

// tone is n samples of a loud sine.
func tone(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(0.5 * math.Sin(float64(i)*0.3))
	}
	return s
}
