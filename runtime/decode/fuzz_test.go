package decode

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"
)

// FuzzStopper splits a text at fuzzer-chosen points and checks the released text against a
// direct reference: after each piece, if the text so far contains a stop string, generation
// ends and the text before the earliest such occurrence is what was released in all.
func FuzzStopper(f *testing.F) {
	f.Add("hello ### world", "###", "ab", []byte{1, 2, 3})
	f.Add("日本語のテキスト。\n次", "。\n", "テキ", []byte{2, 1, 1, 4})
	f.Add("aaab", "aab", "b", []byte{1})
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, cuts []byte) {
		var stops []string
		for _, st := range []string{stop1, stop2} {
			if st != "" {
				stops = append(stops, st)
			}
		}
		s, err := NewStopper(StopConfig{VocabSize: 4, EOG: []int32{0}, Stop: stops})
		if err != nil {
			for _, st := range stops {
				if len(st) > MaxStopBytes {
					return // refused, as it must be
				}
			}
			t.Fatal(err)
		}
		want, stopped := text, false
		var got []byte
		reason := NotStopped
		for i, c := 0, 0; i < len(text) && reason == NotStopped; c++ {
			w := 1
			if len(cuts) > 0 {
				w = 1 + int(cuts[c%len(cuts)])%5
			}
			j := min(i+w, len(text))
			var out []byte
			out, reason = s.Push(1, text[i:j])
			got = append(got, out...)
			i = j
			if !stopped {
				for _, st := range stops {
					if k := bytes.Index([]byte(text[:j]), []byte(st)); k >= 0 && (!stopped || k < len(want)) {
						want, stopped = text[:k], true
					}
				}
			}
		}
		if (reason == StopString) != stopped {
			t.Fatalf("reason %q, reference stopped: %v", reason, stopped)
		}
		if reason == NotStopped {
			out, r := s.Push(0, "") // EOS releases the rest
			if r != StopEOS {
				t.Fatalf("EOS gave reason %q", r)
			}
			got = append(got, out...)
		}
		if string(got) != want {
			t.Fatalf("released %q, want %q", got, want)
		}
	})
}

// FuzzSample feeds arbitrary float32 bit patterns (NaN, ±Inf, subnormals) to every sampler
// configuration: it must return a valid token or an error, never panic, and leave the logits
// as they were.
func FuzzSample(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 128, 255, 1, 2, 3, 4})
	f.Add([]byte{0, 0, 192, 127, 0, 0, 128, 127})
	f.Fuzz(func(t *testing.T, raw []byte) {
		n := len(raw) / 4
		if n == 0 {
			return
		}
		if len(raw)%4 != 0 { // tiled past top-p's first sort (256 candidates), into its buckets
			n = max(n, 1100)
		}
		logits := make([]float32, n)
		for i := range logits {
			j := i % (len(raw) / 4)
			logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
		orig := make([]uint32, n)
		for i, v := range logits {
			orig[i] = math.Float32bits(v)
		}
		for _, p := range []Params{
			{Temperature: 0, TopP: 1, RepeatPenalty: 1.3, RepeatLastN: 4, LogitBias: map[int32]float32{0: -1}},
			{Temperature: 0.8, TopK: 2, TopP: 0.9, MinP: 0.1, RepeatPenalty: 1, PresencePenalty: 1},
			{Temperature: 2, TopP: 0.5, RepeatPenalty: 1},
			{Temperature: 1, TopP: 1, MinP: 0.5, RepeatPenalty: 1, FrequencyPenalty: -1},
		} {
			s, err := NewSampler(p, n)
			if err != nil {
				t.Fatal(err)
			}
			for step := 0; step < 3; step++ {
				id, err := s.Sample(logits)
				if err == nil {
					if id < 0 || int(id) >= n {
						t.Fatalf("token %d outside [0, %d)", id, n)
					}
					if v := logits[id]; v != v || math.IsInf(float64(v), -1) {
						t.Fatalf("drew token %d with logit %v", id, v)
					}
					s.Accept(id)
				}
				for i, v := range logits {
					if math.Float32bits(v) != orig[i] {
						t.Fatalf("logit %d changed", i)
					}
				}
			}
		}
		TopLogprobs(logits, 3, nil)
	})
}

// TestSampleExtremes: a logit near float32's largest value, or a temperature whose inverse is
// not a float32, once overflowed the tempered logits to +Inf, whose weights came out NaN, and
// the draw indexed its candidates at -1 (found by FuzzSample). Every configuration now draws
// the largest logit's token, or one of the tied best, as the limit of the distribution says.
func TestSampleExtremes(t *testing.T) {
	for _, c := range []struct {
		temp   float32
		logits []float32
		want   []int32
	}{
		{0.8, []float32{2.87e38}, []int32{0}},
		{0.8, []float32{-3e38, 3e38, 1}, []int32{1}},
		{1e-40, []float32{1, 2, 1.5}, []int32{1}},
		{1e-40, []float32{2, 2, -1}, []int32{0, 1}},
		{1e-45, []float32{0, float32(math.Inf(-1)), 0.5}, []int32{2}},
	} {
		for _, p := range []Params{
			{Temperature: c.temp, TopP: 1, RepeatPenalty: 1},
			{Temperature: c.temp, TopK: 2, TopP: 0.9, RepeatPenalty: 1},
			{Temperature: c.temp, TopP: 0.5, MinP: 0.01, RepeatPenalty: 1},
		} {
			s, err := NewSampler(p, len(c.logits))
			if err != nil {
				t.Fatal(err)
			}
			for range 20 {
				id, err := s.Sample(c.logits)
				if err != nil {
					t.Fatalf("T=%g %v: %v", c.temp, c.logits, err)
				}
				if !slices.Contains(c.want, id) {
					t.Fatalf("T=%g %v (%+v): drew %d, want one of %v", c.temp, c.logits, p, id, c.want)
				}
			}
		}
	}
}

// TestSampleFarLogits: top-p over more candidates than its first sort, with one logit ~1e30
// below the rest, once converted the gap to an int past its range and indexed a bucket at
// MinInt64; and logits spread past float32's range, at a temperature as large, once lost the far
// token's weight (its difference overflowed before the scaling). Both found by review.
func TestSampleFarLogits(t *testing.T) {
	flat := make([]float32, 1001)
	flat[1000] = -1e30
	s, err := NewSampler(Params{Temperature: 1, TopP: 0.9, RepeatPenalty: 1, Seed: 1}, len(flat))
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if id, err := s.Sample(flat); err != nil || id < 0 || id >= 1000 {
			t.Fatalf("drew %d, %v", id, err)
		}
	}
	spread := []float32{-3e38, 3e38, 3e38, 0}
	s, err = NewSampler(Params{Temperature: 3.4e38, TopP: 1, RepeatPenalty: 1, Seed: 2}, len(spread))
	if err != nil {
		t.Fatal(err)
	}
	const draws = 4000
	n0 := 0
	for range draws {
		id, err := s.Sample(spread)
		if err != nil {
			t.Fatal(err)
		}
		if id == 0 {
			n0++
		}
	}
	// weights e^-1.765, 1, 1, e^-0.882: token 0 has p = 0.0666; 5 standard deviations is ±0.0197
	if p := float64(n0) / draws; math.Abs(p-0.0666) > 0.0197 {
		t.Errorf("token 0 drawn %.4f of the time, want 0.0666", p)
	}
}
