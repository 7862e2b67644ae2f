package asr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The fake audio spells words as loud blocks: word k is a square wave of amplitude
// level(k), 300 ms long, words 100 ms apart. The fake transcriber reads the blocks back with their
// times, leaving out a block that touches the end of its buffer (a word still being spoken), as
// a recogniser is unsure of the last word.

const wordMs, gapMs = 300, 100

func level(k int) float32 { return 0.05 * float32(k%15+1) }

func wordName(k int) string { return fmt.Sprintf("w%d", k%15) }

// speech renders words ks, each followed by a gap; [n] samples.
func speech(ks []int) []float32 {
	var out []float32
	for _, k := range ks {
		for i := 0; i < wordMs*16; i++ {
			v := level(k)
			if i%2 == 1 {
				v = -v
			}
			out = append(out, v)
		}
		out = append(out, make([]float32, gapMs*16)...)
	}
	return out
}

func quiet(ms int) []float32 { return make([]float32, ms*16) }

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

type fakeTr struct {
	clock   *fakeClock
	cost    func(n int) time.Duration // clock time one call takes for n samples
	calls   int
	err     error
	prompts []string
	maxLen  int
}

func (f *fakeTr) Transcribe(ctx context.Context, pcm []float32, p Params, _ func(Segment)) (*Result, error) {
	f.calls++
	f.prompts = append(f.prompts, p.InitialPrompt)
	f.maxLen = max(f.maxLen, len(pcm))
	if !p.NoContext {
		return nil, errors.New("session must set NoContext")
	}
	if f.cost != nil {
		f.clock.t = f.clock.t.Add(f.cost(len(pcm)))
	}
	if f.err != nil {
		return nil, f.err
	}
	res := &Result{Duration: float64(len(pcm)) / SampleRate}
	seg := Segment{}
	const fr = 160
	for i := 0; i+fr <= len(pcm); {
		if math.Abs(float64(pcm[i])) < 0.01 {
			i += fr
			continue
		}
		a := math.Abs(float64(pcm[i]))
		j := i
		for j+fr <= len(pcm) && math.Abs(float64(pcm[j])) >= 0.01 {
			j += fr
		}
		if j+fr > len(pcm) { // runs to the end: unsure
			break
		}
		k := int(math.Round(a/0.05)) - 1
		seg.Tokens = append(seg.Tokens,
			Token{ID: 1, Text: " " + wordName(k), T0: float64(i) / SampleRate, T1: float64(j) / SampleRate},
			Token{ID: 9999, Text: "[_TT_]", T0: float64(j) / SampleRate, T1: float64(j) / SampleRate})
		seg.Text += " " + wordName(k)
		i = j
	}
	if len(seg.Tokens) > 0 {
		res.Segments = []Segment{seg}
		res.Text = seg.Text
	}
	return res, nil
}

func newTest(t *testing.T, cfg SessionConfig, cost func(int) time.Duration) (*Session, *fakeTr) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(0, 0)}
	tr := &fakeTr{clock: clk, cost: cost}
	cfg.Now = clk.Now
	cfg.IsSpecial = func(id int32) bool { return id >= 9999 }
	s, err := NewSession(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, tr
}

// feed writes pcm in chunks of ms milliseconds and collects the events.
func feed(t *testing.T, s *Session, pcm []float32, ms int) []Event {
	t.Helper()
	var evs []Event
	n := ms * 16
	for i := 0; i < len(pcm); i += n {
		ev, err := s.Write(context.Background(), pcm[i:min(i+n, len(pcm))])
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev...)
	}
	return evs
}

func finals(evs []Event) (text []string, last float64, ok bool) {
	ok = true
	for _, e := range evs {
		if e.Type != "final" {
			continue
		}
		if e.Start < last-1e-9 || e.End < e.Start {
			ok = false
		}
		last = e.End
		if e.Text != "" {
			text = append(text, e.Text)
		}
	}
	return
}

func wordsOf(ks []int) string {
	var w []string
	for _, k := range ks {
		w = append(w, wordName(k))
	}
	return strings.Join(w, " ")
}

// TestLocalAgreement: continuous speech (gaps shorter than the endpoint) is settled word by word
// as consecutive hypotheses agree, partials come first, and the finals with the committed rest
// spell every word once, in order, with times that never go back.
func TestLocalAgreement(t *testing.T) {
	s, tr := newTest(t, SessionConfig{}, nil)
	ks := []int{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4}
	evs := feed(t, s, speech(ks), 100)
	nFinal, nPartial := 0, 0
	for _, e := range evs {
		switch e.Type {
		case "final":
			nFinal++
		case "partial":
			nPartial++
		}
	}
	if nFinal == 0 || nPartial == 0 {
		t.Fatalf("before commit: %d finals, %d partials; want both", nFinal, nPartial)
	}
	ev, err := s.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	evs = append(evs, ev...)
	text, _, mono := finals(evs)
	if got, want := strings.Join(text, " "), wordsOf(ks); got != want {
		t.Errorf("finals %q, want %q", got, want)
	}
	if !mono {
		t.Errorf("final times go back: %+v", evs)
	}
	if tr.maxLen > 30*SampleRate {
		t.Errorf("transcribed %d samples at once, more than 30 s", tr.maxLen)
	}
	// The buffer is cut at settled words: no call saw the whole 8 s stream.
	if tr.maxLen >= len(speech(ks)) {
		t.Errorf("buffer never trimmed: longest call %d samples", tr.maxLen)
	}
	// Finals condition later prompts.
	if last := tr.prompts[len(tr.prompts)-1]; !strings.HasPrefix(wordsOf(ks), last) || last == "" {
		t.Errorf("last prompt %q is not a prefix of the final text", last)
	}
	for _, e := range evs {
		if e.Type == "final" && e.Text != "" && len(e.Segments) == 0 {
			t.Errorf("final %q without segments", e.Text)
		}
	}
}

// TestEndpoint: quiet after speech ends the utterance without a commit; quiet alone is never
// transcribed; the next utterance starts clean.
func TestEndpoint(t *testing.T) {
	s, tr := newTest(t, SessionConfig{Silence: 600 * time.Millisecond}, nil)
	evs := feed(t, s, quiet(5000), 100)
	if tr.calls != 0 || len(evs) != 0 {
		t.Fatalf("quiet: %d transcriptions, events %+v", tr.calls, evs)
	}
	if len(s.buf) > leadSamples+frameSamples {
		t.Errorf("quiet buffered: %d samples", len(s.buf))
	}
	a, b := []int{1, 2, 3}, []int{4, 5}
	pcm := append(append(append(speech(a), quiet(700)...), speech(b)...), quiet(700)...)
	evs = feed(t, s, pcm, 40)
	text, last, mono := finals(evs)
	if got := strings.Join(text, " "); got != wordsOf(a)+" "+wordsOf(b) {
		t.Errorf("finals %q, want %q", got, wordsOf(a)+" "+wordsOf(b))
	}
	if !mono || last < 5 {
		t.Errorf("final times: monotone %v, last end %.2f (stream time, after 5 s of quiet)", mono, last)
	}
	if len(s.buf) > s.silence {
		t.Errorf("after the endpoint %d samples stay buffered", len(s.buf))
	}
	ev, err := s.Commit(context.Background())
	if err != nil || len(ev) != 0 {
		t.Errorf("commit after endpoint: %+v %v", ev, err)
	}
}

// TestSlowTranscriber: a transcriber that takes 2.5 s (by the clock) per call is called about once
// per 2.5 s of audio, not once per step.
func TestSlowTranscriber(t *testing.T) {
	s, tr := newTest(t, SessionConfig{Silence: -1}, func(int) time.Duration { return 2500 * time.Millisecond })
	ks := make([]int, 50) // 20 s
	for i := range ks {
		ks[i] = i
	}
	feed(t, s, speech(ks), 100)
	if tr.calls > 20/2.5+2 {
		t.Errorf("%d transcriptions of 20 s at 2.5 s each", tr.calls)
	}
	if st := s.Stats(); st.Busy != time.Duration(tr.calls)*2500*time.Millisecond || st.Audio != 20*time.Second {
		t.Errorf("stats %+v", st)
	}
}

// TestMaxBuffer: a buffer that never settles (every hypothesis differs) is finalized at MaxBuffer.
func TestMaxBuffer(t *testing.T) {
	clk := &fakeClock{}
	n := 0
	tr := transcriberFunc(func(ctx context.Context, pcm []float32, p Params) (*Result, error) {
		n++
		end := float64(len(pcm)) / SampleRate
		return &Result{Segments: []Segment{{Tokens: []Token{{Text: fmt.Sprintf(" x%d", n), T0: 0, T1: end}}}}}, nil
	})
	s, err := NewSession(tr, SessionConfig{MaxBuffer: 5 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	tone := make([]float32, 12*SampleRate)
	for i := range tone {
		tone[i] = float32(0.3 * math.Sin(float64(i)*0.05))
	}
	evs := feed(t, s, tone, 250)
	var ends []float64
	for _, e := range evs {
		if e.Type == "final" {
			ends = append(ends, e.End)
		}
	}
	if len(ends) != 2 || math.Abs(ends[0]-5) > 0.02 || math.Abs(ends[1]-10) > 0.02 {
		t.Errorf("finals end at %v, want [5 10]", ends)
	}
}

type transcriberFunc func(ctx context.Context, pcm []float32, p Params) (*Result, error)

func (f transcriberFunc) Transcribe(ctx context.Context, pcm []float32, p Params, _ func(Segment)) (*Result, error) {
	return f(ctx, pcm, p)
}

// TestTranscriberError: an error reaches the caller and the session goes on.
func TestTranscriberError(t *testing.T) {
	s, tr := newTest(t, SessionConfig{}, nil)
	tr.err = errors.New("boom")
	var got error
	pcm := speech([]int{1, 2, 3, 4})
	for i := 0; i < len(pcm); i += 1600 {
		if _, err := s.Write(context.Background(), pcm[i:min(i+1600, len(pcm))]); err != nil {
			got = err
		}
	}
	if got == nil || got.Error() != "boom" {
		t.Fatalf("error %v, want boom", got)
	}
	tr.err = nil
	ev, err := s.Commit(context.Background())
	if err != nil || len(ev) != 1 || ev[0].Text != wordsOf([]int{1, 2, 3, 4}) {
		t.Errorf("after the error: %+v %v", ev, err)
	}
}

// wordsString shows words with the white space before each and their times.
func wordsString(ws []Word) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "[%q %q %g-%g s%d]", w.pre, w.Word, w.Start, w.End, w.seg)
	}
	return b.String()
}

func TestWords(t *testing.T) {
	segs := []Segment{
		{Tokens: []Token{{ID: 50364, Text: "[_TT_0]"}, {ID: 1, Text: " Hel", T0: 0, T1: 0.2}, {ID: 2, Text: "lo", T0: 0.2, T1: 0.3},
			{ID: 3, Text: ",", T0: 0.3, T1: 0.35}, {ID: 4, Text: " world", T0: 0.35, T1: 0.8}, {ID: 50400, Text: "[_TT_40]"}}},
		{Tokens: []Token{{ID: 5, Text: "Again", T0: 1, T1: 1.5}}},
	}
	ws := Words(segs, func(id int32) bool { return id >= 50257 }, "en")
	want := []Word{{"Hello,", 0, 0.35, 0, " "}, {"world", 0.35, 0.8, 0, " "}, {"Again", 1, 1.5, 1, ""}}
	if wordsString(ws) != wordsString(want) {
		t.Errorf("Words = %s, want %s", wordsString(ws), wordsString(want))
	}
	if got := joinWords(ws); got != "Hello, worldAgain" {
		t.Errorf("joinWords = %q, want the segments' text as it is", got)
	}
	if commonPrefix(ws, []Word{{Word: "hello"}, {Word: "World!"}, {Word: "x"}}) != 2 {
		t.Error("commonPrefix ignores case and punctuation")
	}
}

// TestWordsByCharacter: in Chinese, Japanese, Thai, Lao, Burmese and Cantonese every whole
// character is a word, as OpenAI's split_tokens_on_unicode makes them (a token holding part of a
// character joins the next; a token of two characters stays one word), with its punctuation
// joined to the word before it; other languages keep splitting at spaces.
func TestWordsByCharacter(t *testing.T) {
	seg := Segment{Tokens: []Token{
		{ID: 50364, Text: "[_TT_0]"},
		{ID: 1, Text: "\xe4\xbd", T0: 0, T1: 0.1}, // the first two bytes of 你
		{ID: 2, Text: "\xa0", T0: 0.1, T1: 0.2},   // ... and its last
		{ID: 3, Text: "好", T0: 0.2, T1: 0.4},
		{ID: 4, Text: "，", T0: 0.4, T1: 0.5},
		{ID: 5, Text: "世界", T0: 0.5, T1: 0.9},
		{ID: 6, Text: "。", T0: 0.9, T1: 1},
		{ID: 50414, Text: "[_TT_50]"},
	}}
	special := func(id int32) bool { return id >= 50257 }
	want := []Word{{"你", 0, 0.2, 0, ""}, {"好，", 0.2, 0.5, 0, ""}, {"世界。", 0.5, 1, 0, ""}}
	for _, lang := range []string{"zh", "ja", "yue"} {
		if ws := Words([]Segment{seg}, special, lang); wordsString(ws) != wordsString(want) {
			t.Errorf("%s: Words = %s, want %s", lang, wordsString(ws), wordsString(want))
		} else if got := joinWords(ws); got != "你好，世界。" {
			t.Errorf("%s: joinWords = %q", lang, got)
		}
	}
	ja := Segment{Tokens: []Token{{ID: 1, Text: "こん", T0: 0, T1: 0.2}, {ID: 2, Text: "にち", T0: 0.2, T1: 0.4},
		{ID: 3, Text: "は", T0: 0.4, T1: 0.5}, {ID: 4, Text: " (", T0: 0.5, T1: 0.6}, {ID: 5, Text: "東", T0: 0.6, T1: 0.8}, {ID: 6, Text: ")", T0: 0.8, T1: 0.9}}}
	want = []Word{{"こん", 0, 0.2, 0, ""}, {"にち", 0.2, 0.4, 0, ""}, {"は", 0.4, 0.5, 0, ""}, {"(東)", 0.5, 0.9, 0, " "}}
	if ws := Words([]Segment{ja}, nil, "ja"); wordsString(ws) != wordsString(want) {
		t.Errorf("ja: Words = %s, want %s", wordsString(ws), wordsString(want))
	}
	th := Segment{Tokens: []Token{{ID: 1, Text: "สวัส", T0: 0, T1: 0.3}, {ID: 2, Text: "ดี", T0: 0.3, T1: 0.5}}}
	if ws := Words([]Segment{th}, nil, "th"); len(ws) != 2 {
		t.Errorf("th: Words = %s, want a word a token", wordsString(ws))
	}
	// Other languages: a word a space.
	if ws := Words([]Segment{seg}, special, "en"); len(ws) != 1 || ws[0].Word != "你好，世界。" {
		t.Errorf("en: Words = %s, want one word", wordsString(ws))
	}
}

// scripted is a transcriber that answers its calls with the segments of texts in turn (the last
// again once they run out), in the language lang. Each text is a segment of tokens separated by
// "|"; the tokens share the audio given evenly.
func scripted(lang string, texts ...[]string) (Transcriber, *[]string) {
	var prompts []string
	n := 0
	return transcriberFunc(func(ctx context.Context, pcm []float32, p Params) (*Result, error) {
		prompts = append(prompts, p.InitialPrompt)
		segs := texts[min(n, len(texts)-1)]
		n++
		res := &Result{Language: lang, Duration: float64(len(pcm)) / SampleRate}
		var all []string
		for _, s := range segs {
			all = append(all, strings.Split(s, "|")...)
		}
		step, k := res.Duration/float64(len(all)), 0
		for _, s := range segs {
			seg := Segment{Text: strings.ReplaceAll(s, "|", "")}
			for _, tok := range strings.Split(s, "|") {
				seg.Tokens = append(seg.Tokens, Token{ID: int32(k), Text: tok, T0: float64(k) * step, T1: float64(k+1) * step})
				k++
			}
			res.Segments = append(res.Segments, seg)
			res.Text += seg.Text
		}
		return res, nil
	}), &prompts
}

func toneSec(sec float64) []float32 {
	pcm := make([]float32, int(sec*SampleRate))
	for i := range pcm {
		pcm[i] = float32(0.3 * math.Sin(float64(i)*0.05))
	}
	return pcm
}

// TestFinalKeepsSpacing: a final's text is the segments' text as the transcriber spells it, the
// way the offline transcription joins them: a word cut by a segment's end is not split by a
// space, and the next prompt carries it so.
func TestFinalKeepsSpacing(t *testing.T) {
	tr, prompts := scripted("en", []string{" And| so| co|ached", "oth|al| went."})
	s, err := NewSession(tr, SessionConfig{Step: time.Minute, Silence: -1, Now: (&fakeClock{}).Now})
	if err != nil {
		t.Fatal(err)
	}
	evs := feed(t, s, toneSec(2), 100)
	ev, err := s.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	evs = append(evs, ev...)
	const want = "And so coachedothal went."
	if len(evs) != 1 || evs[0].Type != "final" || evs[0].Text != want {
		t.Fatalf("events %+v, want one final %q", evs, want)
	}
	if sg := evs[0].Segments; len(sg) != 2 || sg[0].Text != "And so coached" || sg[1].Text != "othal went." {
		t.Errorf("final segments %+v", sg)
	}
	s.Write(context.Background(), toneSec(0.5))
	s.Commit(context.Background())
	if p := (*prompts)[len(*prompts)-1]; p != want {
		t.Errorf("prompt after the final %q, want %q", p, want)
	}
}

// TestSessionByCharacter: the language the transcriber names reaches the word split, so Chinese
// text is settled character by character as two hypotheses agree, not a segment at a time.
func TestSessionByCharacter(t *testing.T) {
	tr, _ := scripted("zh", []string{"你|好"}, []string{"你|好|世|界"})
	s, err := NewSession(tr, SessionConfig{Silence: -1, Now: (&fakeClock{}).Now})
	if err != nil {
		t.Fatal(err)
	}
	evs := feed(t, s, toneSec(2), 100)
	var final, partial []string
	for _, e := range evs {
		if e.Type == "final" {
			final = append(final, e.Text)
		} else {
			partial = append(partial, e.Text)
		}
	}
	if fmt.Sprint(final) != "[你好]" || len(partial) == 0 || partial[0] != "你好" {
		t.Errorf("finals %q, partials %q; want the final 你好 after the partial 你好", final, partial)
	}
}

func TestBadConfig(t *testing.T) {
	tr := &fakeTr{clock: &fakeClock{}}
	for _, c := range []SessionConfig{{Step: -1}, {SilenceRMS: float32(math.NaN())}, {Params: Params{BeamSize: 99}}} {
		if _, err := NewSession(tr, c); err == nil {
			t.Errorf("NewSession(%+v) accepted", c)
		}
	}
	if _, err := NewSession(nil, SessionConfig{}); err == nil {
		t.Error("nil transcriber accepted")
	}
}

// TestPromptTail: the final text carried into the next prompt is cut to PromptBytes at a word
// where there is one, else at a character, never inside a UTF-8 sequence or before a combining
// mark.
func TestPromptTail(t *testing.T) {
	cases := []struct {
		text string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"one two three four", 12, "three four"},
		{"one two three four", 8, "four"},        // the cut falls inside "three"
		{"one two three four", 10, "three four"}, // ... just after a space
		{"我们今天讨论了很多问题", 10, "多问题"},               // 3-byte characters: 9 bytes of 10
		{"我们今天讨论了很多问题", 12, "很多问题"},
		{"日本語のテキストです", 8, "です"},
		{"ok 我们今天讨论了很多问题", 16, "了很多问题"},            // the space is outside the tail
		{"今天讨论了很多问题 ok", 20, "了很多问题 ok"},           // ... or in its second half: not used
		{"cafe\u0301 au lait", 9, "au lait"},       // a combining acute accent
		{"x\u0301\u0301\u0301\u0301abc", 5, "abc"}, // marks are skipped with their base
		{"\xff\xfe\xfdabc", 4, "abc"},              // invalid bytes are not a character
		{"abcdef", 0, ""},
	}
	for _, c := range cases {
		got := promptTail(c.text, c.n)
		if got != c.want || !utf8.ValidString(got) || len(got) > c.n || !strings.HasSuffix(c.text, got) {
			t.Errorf("promptTail(%q, %d) = %q, want %q", c.text, c.n, got, c.want)
		}
	}
	// Through a session: a final of Chinese text longer than PromptBytes.
	s, tr := newTest(t, SessionConfig{PromptBytes: 16}, nil)
	s.final([]Word{{Word: "我们今天讨论了很多问题"}})
	s.hypothesis(context.Background())
	if p := tr.prompts[len(tr.prompts)-1]; !utf8.ValidString(p) || p == "" || !strings.HasSuffix("我们今天讨论了很多问题", p) {
		t.Errorf("prompt %q after a Chinese final", p)
	}
}

// TestFinalTokens: a final carries the text tokens of its words, special tokens left out, with
// their log-probabilities: settled by agreement, the first words' tokens (a word cut into
// tokens, and across a segment's end, whole); at a commit, all of them. Put together and
// trimmed, their texts are the final's text.
func TestFinalTokens(t *testing.T) {
	inner, _ := scripted("en", []string{" Hello| wor|ld", " again"}, []string{" Hello| wor|ld", " again| and|,| mo|re"})
	const special = 1000
	tr := transcriberFunc(func(ctx context.Context, pcm []float32, p Params) (*Result, error) {
		res, err := inner.Transcribe(ctx, pcm, p, nil)
		if err != nil {
			return nil, err
		}
		for i := range res.Segments {
			sg := &res.Segments[i]
			for j := range sg.Tokens {
				sg.Tokens[j].PLog = -float32(sg.Tokens[j].ID+1) / 8
			}
			sg.Tokens = append(sg.Tokens, Token{ID: special, Text: "<|t|>", PLog: -9})
		}
		return res, nil
	})
	s, err := NewSession(tr, SessionConfig{Silence: -1, Now: (&fakeClock{}).Now, IsSpecial: func(id int32) bool { return id == special }})
	if err != nil {
		t.Fatal(err)
	}
	evs := feed(t, s, toneSec(3), 100)
	ev, err := s.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	evs = append(evs, ev...)
	var got []string
	for _, e := range evs {
		if e.Type != "final" {
			continue
		}
		var b strings.Builder
		var toks []string
		for _, tk := range e.Tokens {
			b.WriteString(tk.Text)
			toks = append(toks, fmt.Sprintf("%s:%g", tk.Text, tk.PLog))
		}
		if strings.TrimSpace(b.String()) != e.Text {
			t.Errorf("final %q: tokens %q", e.Text, toks)
		}
		got = append(got, strings.Join(toks, "|"))
	}
	want := []string{" Hello:-0.125| wor:-0.25|ld:-0.375| again:-0.5", " Hello:-0.125| wor:-0.25|ld:-0.375| again:-0.5| and:-0.625|,:-0.75| mo:-0.875|re:-1"}
	if len(got) < 2 || got[0] != want[0] || got[len(got)-1] != want[1] {
		t.Errorf("finals' tokens %q, want the first %q and the last (the commit's) %q", got, want[0], want[1])
	}
}
