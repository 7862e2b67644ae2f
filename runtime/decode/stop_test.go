package decode

import (
	"strings"
	"testing"
	"unicode/utf8"
)

type tok struct {
	id   int32
	text string
}

func TestStopper(t *testing.T) {
	const eos = 2
	cases := []struct {
		name   string
		stops  []string
		max    int
		toks   []tok
		emits  []string // per pushed token, until the stop
		reason StopReason
	}{
		{
			name:   "plain text then EOS",
			toks:   []tok{{10, "Hello"}, {11, ", world"}, {eos, "</s>"}, {12, "after"}},
			emits:  []string{"Hello", ", world", ""},
			reason: StopEOS,
		},
		{
			name:   "stop string inside one token",
			stops:  []string{"END"},
			toks:   []tok{{10, "abc"}, {11, "xxENDyy"}, {12, "zz"}},
			emits:  []string{"abc", "xx"},
			reason: StopString,
		},
		{
			name:   "stop string across three tokens",
			stops:  []string{"###"},
			toks:   []tok{{10, "Hello #"}, {11, "#"}, {12, "# world"}},
			emits:  []string{"Hello ", "", ""},
			reason: StopString,
		},
		{
			name:   "partial prefix held back then released",
			stops:  []string{"###"},
			toks:   []tok{{10, "a #"}, {11, "#"}, {12, "b"}, {eos, ""}},
			emits:  []string{"a ", "", "##b", ""},
			reason: StopEOS,
		},
		{
			name:   "held prefix released on EOS",
			stops:  []string{"User:"},
			toks:   []tok{{10, "fine. Us"}, {eos, ""}},
			emits:  []string{"fine. ", "Us"},
			reason: StopEOS,
		},
		{
			name:   "earliest of several stops wins",
			stops:  []string{"bb", "abc"},
			toks:   []tok{{10, "xa"}, {11, "bcbb"}},
			emits:  []string{"x", ""},
			reason: StopString,
		},
		{
			name:   "overlapping prefixes: held suffix is the longest",
			stops:  []string{"aab"},
			toks:   []tok{{10, "xaa"}, {11, "a"}, {12, "b!"}},
			emits:  []string{"x", "a", ""},
			reason: StopString,
		},
		{
			name:   "UTF-8 character split across tokens",
			toks:   []tok{{10, "caf\xc3"}, {11, "\xa9 "}, {12, "\xe6\x97"}, {13, "\xa5\xe6\x9c\xac"}, {eos, ""}},
			emits:  []string{"caf", "é ", "", "日本", ""},
			reason: StopEOS,
		},
		{
			name:   "multi-byte stop string split inside a character",
			stops:  []string{"。\n"},
			toks:   []tok{{10, "終わり\xe3"}, {11, "\x80"}, {12, "\x82\n次"}},
			emits:  []string{"終わり", "", ""},
			reason: StopString,
		},
		{
			name:   "multi-byte near-miss is released whole",
			stops:  []string{"。\n"},
			toks:   []tok{{10, "A\xe3\x80"}, {11, "\x82B"}, {eos, ""}},
			emits:  []string{"A", "。B", ""},
			reason: StopEOS,
		},
		{
			name:   "length limit releases held text",
			stops:  []string{"###"},
			max:    3,
			toks:   []tok{{10, "a"}, {11, "b #"}, {12, "#"}, {13, "c"}},
			emits:  []string{"a", "b ", "##"},
			reason: StopLength,
		},
		{
			name:   "stop string beats length on the same token",
			stops:  []string{"!"},
			max:    2,
			toks:   []tok{{10, "hi"}, {11, " there! more"}},
			emits:  []string{"hi", " there"},
			reason: StopString,
		},
		{
			name:   "EOS checked by IsEOG table",
			toks:   []tok{{10, "x"}, {99, "<|eot|>"}},
			emits:  []string{"x", ""},
			reason: StopEOS,
		},
		{
			name:   "invalid bytes are not held",
			toks:   []tok{{10, "a\xff"}, {11, "\x80b"}, {eos, ""}},
			emits:  []string{"a\xff", "\x80b", ""},
			reason: StopEOS,
		},
	}
	for _, c := range cases {
		s, err := NewStopper(StopConfig{
			VocabSize: 100,
			EOG:       []int32{eos},
			IsEOG:     func(id int32) bool { return id == 99 },
			Stop:      c.stops,
			MaxTokens: c.max,
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for round := 0; round < 2; round++ { // the second round checks Reset
			var got []string
			var reason StopReason
			for _, tk := range c.toks {
				out, r := s.Push(tk.id, tk.text)
				if reason != NotStopped {
					if out != nil || r != reason {
						t.Errorf("%s: Push after stop returned %q, %q", c.name, out, r)
					}
					continue
				}
				got = append(got, string(out))
				reason = r
			}
			if strings.Join(got, "|") != strings.Join(c.emits, "|") || reason != c.reason {
				t.Errorf("%s (round %d): emitted %q, reason %q; want %q, %q", c.name, round, got, reason, c.emits, c.reason)
			}
			if s.Reason() != c.reason {
				t.Errorf("%s: Reason() = %q", c.name, s.Reason())
			}
			s.Reset()
		}
	}
}

// TestStopperStream pushes a text cut at every possible byte boundary into pieces of one to
// three bytes and checks that the released text is the text up to the stop string, and that
// before the stop nothing is released that ends in an incomplete character.
func TestStopperStream(t *testing.T) {
	text := "Ünïcödé — テキスト <stop> after"
	wantAll := "Ünïcödé — テキスト "
	s, err := NewStopper(StopConfig{VocabSize: 10, EOG: []int32{0}, Stop: []string{"<stop>", "テキストX"}})
	if err != nil {
		t.Fatal(err)
	}
	for seed := 0; seed < 200; seed++ {
		s.Reset()
		var got strings.Builder
		reason := NotStopped
		for i := 0; i < len(text) && reason == NotStopped; {
			w := 1 + (seed*7+i*13)%3
			j := min(i+w, len(text))
			var out []byte
			if seed%2 == 0 {
				out, reason = s.Push(1, text[i:j])
			} else {
				out, reason = s.PushBytes(1, []byte(text[i:j]))
			}
			if reason == NotStopped && !utf8.Valid(out) {
				t.Fatalf("seed %d: released %q, not valid UTF-8", seed, out)
			}
			got.Write(out)
			i = j
		}
		if reason != StopString || got.String() != wantAll {
			t.Fatalf("seed %d: got %q, %q; want %q", seed, got.String(), reason, wantAll)
		}
	}
}

func TestStopperFinishAndErrors(t *testing.T) {
	s, err := NewStopper(StopConfig{VocabSize: 10, Stop: []string{"ab"}})
	if err != nil {
		t.Fatal(err)
	}
	if out, r := s.Push(1, "xa"); string(out) != "x" || r != NotStopped {
		t.Fatalf("Push: %q %q", out, r)
	}
	if out := s.Finish(); string(out) != "a" {
		t.Fatalf("Finish released %q, want %q", out, "a")
	}
	if out, r := s.Push(1, "b"); out != nil || r != NotStopped {
		t.Fatalf("Push after Finish: %q %q", out, r)
	}
	if s.Tokens() != 1 {
		t.Fatalf("Tokens() = %d", s.Tokens())
	}
	if s.IsEOG(-1) || s.IsEOG(10) {
		t.Fatalf("out-of-range ids reported as EOG")
	}
	for _, c := range []StopConfig{
		{VocabSize: 0},
		{VocabSize: 10, EOG: []int32{10}},
		{VocabSize: 10, EOG: []int32{-1}},
		{VocabSize: 10, Stop: []string{"x", ""}},
		{VocabSize: 10, Stop: []string{strings.Repeat("x", MaxStopBytes+1)}},
		{VocabSize: 10, Stop: make([]string, MaxStopStrings+1)},
	} {
		if _, err := NewStopper(c); err == nil {
			t.Errorf("NewStopper(%+v): no error", c)
		}
	}
}

func TestStopperZeroAllocs(t *testing.T) {
	s, _ := NewStopper(StopConfig{VocabSize: 100, EOG: []int32{2}, Stop: []string{"</answer>", "\n\n"}, MaxTokens: 1 << 30})
	pieces := []string{"The", " answer", " is", " <", "/", "ans", "wer", "?", " no", "\n", "x", "\xe6\x97", "\xa5"}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		s.Push(10, pieces[i%len(pieces)])
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Push", allocs)
	}
}
