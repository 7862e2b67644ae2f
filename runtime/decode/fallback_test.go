package decode

import (
	"bytes"
	"compress/zlib"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// whisperCpp are whisper-cli's thresholds.
var whisperCpp = Fallback{CompressionRatio: 2.4, Entropy: 2.4, LogProb: -1, NoSpeech: 0.6}

func TestFallbackRules(t *testing.T) {
	f := whisperCpp
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"33 tokens of low entropy", f.LowEntropy(33, 2.3), true},
		{"32 tokens of low entropy: too few to judge", f.LowEntropy(32, 0), false},
		{"entropy at the threshold", f.LowEntropy(100, float64(float32(2.4))), false},
		{"unsure: low log-probability, speech", f.Unsure(-1.5, 0.1), true},
		{"log-probability at the threshold", f.Unsure(-1, 0.1), false},
		{"low log-probability in a window of no speech", f.Unsure(-1.5, 0.7), false},
		{"no-speech probability at the threshold: not unsure", f.Unsure(-1.5, float32(0.6)), false},
		{"silent", f.Silent(-1.5, 0.7), true},
		{"silent needs a low log-probability", f.Silent(-0.5, 0.9), false},
		{"silent needs the no-speech probability above the threshold", f.Silent(-1.5, 0.6), false},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestFallbackRetry: a failed or unsure result is retried without measuring its compression; a
// confident one is measured, and retried when it compresses better than the threshold; without a
// threshold it is not measured.
func TestFallbackRetry(t *testing.T) {
	calls := 0
	ratio := func(r float64) func() float64 {
		return func() float64 { calls++; return r }
	}
	for _, c := range []struct {
		name      string
		f         Fallback
		failed    bool
		avg       float64
		noSpeech  float32
		ratio     float64
		want      bool
		wantCalls int
	}{
		{"failed", whisperCpp, true, -0.1, 0, 1, true, 0},
		{"unsure", whisperCpp, false, -2, 0.1, 1, true, 0},
		{"confident, varied text", whisperCpp, false, -0.3, 0.1, 1.8, false, 1},
		{"confident, repetitive text", whisperCpp, false, -0.3, 0.1, 3.5, true, 1},
		{"ratio at the threshold", whisperCpp, false, -0.3, 0.1, float64(float32(2.4)), false, 1},
		{"silence is not retried", whisperCpp, false, -2, 0.9, 1, false, 1},
		{"no compression threshold", Fallback{Entropy: 2.4, LogProb: -1, NoSpeech: 0.6}, false, -0.3, 0.1, 9, false, 0},
	} {
		calls = 0
		if got := c.f.Retry(c.failed, c.avg, c.noSpeech, ratio(c.ratio)); got != c.want || calls != c.wantCalls {
			t.Errorf("%s: retry %v with %d ratio calls, want %v with %d", c.name, got, calls, c.want, c.wantCalls)
		}
	}
}

func TestTemperatures(t *testing.T) {
	got := Temperatures(nil, 0, 0.2)
	var want []float32
	for k := range 6 { // the float32 sums 0.2, 0.4, ... as whisper.cpp accumulates them
		w := float32(0)
		for range k {
			w += 0.2
		}
		want = append(want, w)
	}
	if len(got) != len(want) {
		t.Fatalf("schedule %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("schedule %v, want %v", got, want)
		}
	}
	if got := Temperatures(nil, 0.4, 0); len(got) != 1 || got[0] != 0.4 {
		t.Errorf("no fallback: %v, want [0.4]", got)
	}
	if got := Temperatures(nil, 1, 0.5); len(got) != 1 || got[0] != 1 {
		t.Errorf("start at 1: %v, want [1]", got)
	}
	if got := Temperatures([]float32{9}, 0.5, 0.25); len(got) != 4 || got[0] != 9 || got[1] != 0.5 || got[3] != 1 {
		t.Errorf("appended to [9]: %v, want [9 0.5 0.75 1]", got)
	}
}

// TestTokenEntropy compares with a map-counted float64 entropy on random windows of few distinct
// tokens (as a looping decoder's are).
func TestTokenEntropy(t *testing.T) {
	if e := TokenEntropy([]int32{7, 7, 7, 7}); e != 0 {
		t.Errorf("one token repeated: entropy %v, want 0", e)
	}
	if e := TokenEntropy([]int32{4, 1, 3, 2}); math.Abs(e-math.Log(4)) > 1e-15 {
		t.Errorf("four distinct tokens: entropy %v, want ln 4", e)
	}
	r := rand.New(rand.NewPCG(2, 9))
	for trial := range 200 {
		ids := make([]int32, 1+r.IntN(40))
		for i := range ids {
			ids[i] = int32(50000 + r.IntN(1+r.IntN(12)))
		}
		counts := map[int32]int{}
		for _, id := range ids {
			counts[id]++
		}
		want := 0.0
		for _, c := range counts {
			q := float64(c) / float64(len(ids))
			want -= q * math.Log(q)
		}
		if got := TokenEntropy(append([]int32(nil), ids...)); math.Abs(got-want) > 1e-12 {
			t.Fatalf("trial %d: entropy of %v is %v, want %v", trial, ids, got, want)
		}
	}
}

// TestCompressionRatio compares with a fresh zlib compressor for every text, in turn, with the
// one compressor reused.
func TestCompressionRatio(t *testing.T) {
	var c Compression
	if r := c.Ratio(""); r != 0 {
		t.Errorf("empty text: ratio %v, want 0", r)
	}
	texts := []string{" The quick brown fox jumps over the lazy dog.", strings.Repeat(" again and", 30), "x",
		" Ask not what your country can do for you, ask what you can do for your country."}
	for _, text := range texts {
		var b bytes.Buffer
		zw := zlib.NewWriter(&b)
		zw.Write([]byte(text))
		zw.Close()
		want := float64(len(text)) / float64(b.Len())
		if got := c.Ratio(text); got != want {
			t.Errorf("%.30q: ratio %v, want %v", text, got, want)
		}
	}
	if c.Ratio(texts[1]) < 2.4 || c.Ratio(texts[0]) > 2.4 {
		t.Errorf("repetitive text %v, varied text %v: want them on either side of 2.4", c.Ratio(texts[1]), c.Ratio(texts[0]))
	}
}
