package tokenizer

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// mapMeta is Metadata over a map of Go values.
type mapMeta map[string]any

func (m mapMeta) String(k string) (string, bool)    { v, ok := m[k].(string); return v, ok }
func (m mapMeta) Bool(k string) (bool, bool)        { v, ok := m[k].(bool); return v, ok }
func (m mapMeta) Strings(k string) ([]string, bool) { v, ok := m[k].([]string); return v, ok }
func (m mapMeta) Floats(k string) ([]float32, bool) { v, ok := m[k].([]float32); return v, ok }
func (m mapMeta) Ints(k string) ([]int64, bool)     { v, ok := m[k].([]int64); return v, ok }
func (m mapMeta) Int(k string) (int64, bool)        { v, ok := m[k].(int64); return v, ok }
func (m mapMeta) with(k string, v any) mapMeta {
	c := mapMeta{}
	for a, b := range m {
		c[a] = b
	}
	c[k] = v
	return c
}
func (m mapMeta) without(k string) mapMeta { c := m.with(k, nil); delete(c, k); return c }

// exampleVocab is a tiny SentencePiece vocabulary that spells "hello" and "world".
func exampleVocab() mapMeta {
	tokens := []string{"<unk>", "<s>", "</s>", "▁", "h", "e", "l", "▁hello", "▁world", "o", "w", "r", "d",
		"▁h", "▁he", "▁hel", "▁hell", "▁w", "▁wo", "▁wor", "▁worl"}
	scores := make([]float32, len(tokens))
	types := make([]int64, len(tokens))
	for i, s := range tokens {
		scores[i] = float32(utf8.RuneCountInString(s)) // longer pieces merge first
		types[i] = int64(TypeNormal)
	}
	types[0], types[1], types[2] = int64(TypeUnknown), int64(TypeControl), int64(TypeControl)
	return mapMeta{
		"tokenizer.ggml.model":      "llama",
		"tokenizer.ggml.tokens":     tokens,
		"tokenizer.ggml.scores":     scores,
		"tokenizer.ggml.token_type": types,
	}
}

// byteLevelVocab is a byte-level BPE vocabulary: the 256 byte tokens, a few merges, and
// <|endoftext|> as a control token.
func byteLevelVocab() mapMeta {
	var tokens []string
	for b := 0; b < 256; b++ {
		tokens = append(tokens, string(byteToRune[b]))
	}
	merges := []string{"Ġ h", "e l", "el l", "h ell", "Ġh ell", "ell o", "Ġhell o", "Ã ©"}
	for _, m := range merges {
		tokens = append(tokens, strings.ReplaceAll(m, " ", ""))
	}
	tokens = append(tokens, "<|endoftext|>")
	types := make([]int64, len(tokens))
	for i := range types {
		types[i] = int64(TypeNormal)
	}
	types[len(types)-1] = int64(TypeControl)
	return mapMeta{
		"tokenizer.ggml.model":        "gpt2",
		"tokenizer.ggml.pre":          "gpt-2",
		"tokenizer.ggml.tokens":       tokens,
		"tokenizer.ggml.token_type":   types,
		"tokenizer.ggml.merges":       merges,
		"tokenizer.ggml.eos_token_id": int64(len(tokens) - 1),
		"tokenizer.ggml.bos_token_id": int64(len(tokens) - 1),
	}
}

func mustNew(t *testing.T, md Metadata) *Tokenizer {
	t.Helper()
	tk, err := New(md)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestNewErrors(t *testing.T) {
	base := exampleVocab()
	for _, c := range []struct {
		md   mapMeta
		want string
	}{
		{base.with("tokenizer.ggml.model", "rwkv"), `unsupported tokenizer model "rwkv"`},
		{base.with("tokenizer.ggml.model", "t5"), `unsupported tokenizer model "t5"`},
		{base.without("tokenizer.ggml.model"), "tokenizer.ggml.model missing"},
		{base.without("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens missing"},
		{base.with("tokenizer.ggml.tokens", []string{}), "has 0 tokens"},
		{base.with("tokenizer.ggml.scores", []float32{1}), "tokenizer.ggml.scores has 1 entries for 21 tokens"},
		{base.with("tokenizer.ggml.token_type", []int64{1, 1}), "tokenizer.ggml.token_type has 2 entries"},
		{base.with("tokenizer.ggml.tokens", []string{"a", "b", "a"}).without("tokenizer.ggml.scores").without("tokenizer.ggml.token_type"),
			`duplicate token "a" has ids 0 and 2`},
		{byteLevelVocab().with("tokenizer.ggml.pre", "tekken"), `unsupported pre-tokenizer "tekken"`},
		{byteLevelVocab().without("tokenizer.ggml.merges"), "tokenizer.ggml.merges missing"},
		{byteLevelVocab().with("tokenizer.ggml.add_bos_token", true).without("tokenizer.ggml.bos_token_id").
			with("tokenizer.ggml.tokens", []string{"a"}).without("tokenizer.ggml.token_type"),
			"add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"},
	} {
		_, err := New(c.md)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one containing %q", err, c.want)
		}
	}
}

func TestSPMSynthetic(t *testing.T) {
	md := exampleVocab()
	tk := mustNew(t, md)
	for _, c := range []struct {
		text          string
		add, parse    bool
		want          []int32
		wantDecodeErr bool
	}{
		{"hello world", true, false, []int32{1, 7, 8}, false},
		{"hello world", false, false, []int32{7, 8}, false},
		{"", true, false, []int32{1}, false},
		{"", false, false, nil, false},
		{"<s>hello", false, true, []int32{1, 7}, false},
		{"hello</s>", true, true, []int32{1, 7, 2}, false},
	} {
		got, err := tk.Encode(c.text, c.add, c.parse)
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %v, %v) = %v, want %v", c.text, c.add, c.parse, got, c.want)
		}
	}
	// No byte fallback token for "z": an error, not a panic.
	if _, err := tk.Encode("z", false, false); err == nil || !strings.Contains(err.Error(), "no token for byte 0x7A") {
		t.Errorf("Encode(z) error = %v", err)
	}
	// AppendEncode appends and leaves dst alone on error.
	dst := []int32{42}
	dst, err := tk.AppendEncode(dst, "hello", false, false)
	if err != nil || !slices.Equal(dst, []int32{42, 7}) {
		t.Errorf("AppendEncode = %v, %v", dst, err)
	}
	if got, err := tk.AppendEncode(dst, "zz", false, false); err == nil || !slices.Equal(got, dst) {
		t.Errorf("AppendEncode on error = %v, %v", got, err)
	}
	// add_space_prefix=false
	tk2 := mustNew(t, md.with("tokenizer.ggml.add_space_prefix", false))
	if got, _ := tk2.Encode(" hello", false, false); !slices.Equal(got, []int32{7}) {
		t.Errorf("no space prefix: %v", got)
	}
	v := tk.Vocab()
	if v.Type(0) != TypeUnknown || v.Type(1) != TypeControl || v.Type(7) != TypeNormal || v.Type(99) != TypeUndefined {
		t.Errorf("types %v %v %v %v", v.Type(0), v.Type(1), v.Type(7), v.Type(99))
	}
	if id, ok := v.ID("▁hello"); !ok || id != 7 {
		t.Errorf("ID(▁hello) = %d, %v", id, ok)
	}
	if _, ok := v.ID("nope"); ok {
		t.Error("ID(nope) found")
	}
	if v.Token(7) != "▁hello" || v.Token(-1) != "" || v.Score(7) != 6 {
		t.Errorf("Token/Score wrong: %q %q %v", v.Token(7), v.Token(-1), v.Score(7))
	}
	if got := string(tk.Piece(1)); got != "" {
		t.Errorf("Piece(<s>) = %q", got)
	}
	if got := string(tk.AppendPiece(nil, 1, true)); got != "<s>" {
		t.Errorf("AppendPiece(<s>, special) = %q", got)
	}
	if got := string(tk.Piece(7)); got != " hello" {
		t.Errorf("Piece(▁hello) = %q", got)
	}
	if tk.Piece(-5) != nil || tk.Piece(1000) != nil {
		t.Error("Piece out of range not empty")
	}
}

func TestByteLevelSynthetic(t *testing.T) {
	tk := mustNew(t, byteLevelVocab())
	eot := int32(tk.Vocab().Size - 1)
	hello := int32(256 + 6) // "Ġhello"
	ids, err := tk.Encode("say hello<|endoftext|> é", false, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{'s', 'a', 'y', hello, eot, int32(runeToByte['Ġ']), 256 + 7}
	if !slices.Equal(ids, want) {
		t.Errorf("Encode = %v, want %v", ids, want)
	}
	if got := tk.Decode(ids); got != "say hello é" {
		t.Errorf("Decode = %q", got)
	}
	// Unparsed, the control token's text is ordinary text.
	ids, _ = tk.Encode("<|endoftext|>", false, false)
	if slices.Contains(ids, eot) || tk.Decode(ids) != "<|endoftext|>" {
		t.Errorf("unparsed special: %v", ids)
	}
	if !tk.Vocab().IsEOG(eot) || tk.Vocab().IsEOG(hello) {
		t.Error("IsEOG")
	}
}

// TestDecoderUTF8 feeds a character split across byte tokens and checks what is held back.
func TestDecoderUTF8(t *testing.T) {
	tk := mustNew(t, byteLevelVocab())
	id := func(b byte) int32 { return int32(b) } // byte b's token is id b in byteLevelVocab
	d := tk.NewDecoder()
	steps := []struct {
		in   byte
		want string
	}{
		{0xF0, ""}, {0x9F, ""}, {0xA6, ""}, {0x99, "🦙"}, // 4-byte character across four tokens
		{'a', "a"},
		{0xE2, ""}, {'b', "\xE2b"}, // broken sequence: passed through when it cannot complete
		{0x80, "\x80"}, // stray continuation byte: passed through at once
		{0xC3, ""},
	}
	for _, s := range steps {
		if got := string(d.Write(id(s.in))); got != s.want {
			t.Errorf("Write(0x%02X) = %q, want %q", s.in, got, s.want)
		}
	}
	if got := string(d.Flush()); got != "\xC3" {
		t.Errorf("Flush = %q", got)
	}
	if got := string(d.Flush()); got != "" {
		t.Errorf("second Flush = %q", got)
	}
	// Append appends; control tokens are skipped unless Special.
	eot := int32(tk.Vocab().Size - 1)
	out := d.Append([]byte("x"), eot)
	if string(out) != "x" {
		t.Errorf("Append(control) = %q", out)
	}
	d.Special = true
	if out := d.Append(nil, eot); string(out) != "<|endoftext|>" {
		t.Errorf("Append(control, Special) = %q", out)
	}
	// Multi-byte piece with a trailing partial character.
	d.Reset()
	p := d.Append(nil, 256+7) // "Ã©" = bytes C3 A9 = "é"
	if string(p) != "é" {
		t.Errorf("Append(é) = %q", p)
	}
}

// TestDecoderMatchesDecode: the concatenated Decoder output equals the concatenated pieces for
// arbitrary byte sequences, and every chunk but the flushed tail is cut at a character boundary.
func TestDecoderMatchesDecode(t *testing.T) {
	tk := mustNew(t, byteLevelVocab())
	inputs := []string{"héllo wörld 🦙🚀 日本語", "\xff\xfe abc \xe6\x97", "a\xe6\x97\xa5b", "\xf0\x9f\xa6"}
	for _, s := range inputs {
		var ids []int32
		for i := 0; i < len(s); i++ {
			ids = append(ids, int32(s[i]))
		}
		d := tk.NewDecoder()
		var got []byte
		for _, id := range ids {
			chunk := d.Write(id)
			if utf8.Valid([]byte(s)) && !utf8.Valid(chunk) {
				t.Errorf("%q: chunk %q not valid UTF-8", s, chunk)
			}
			got = append(got, chunk...)
		}
		got = append(got, d.Flush()...)
		if !bytes.Equal(got, []byte(s)) {
			t.Errorf("stream %q, want %q", got, s)
		}
	}
}

func TestWordPieceSynthetic(t *testing.T) {
	tokens := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁world", "▁,", "▁un", "aff", "able", "▁cafe", "▁日", "▁!"}
	md := wordPieceMeta(tokens)
	tk := mustNew(t, md)
	got, err := tk.Encode("Hello,  WORLD! Unaffable Café 日xyz\u200b", true, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []int32{2, 4, 6, 5, 12, 7, 8, 9, 10, 11, 1, 3}
	if !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if tk.Vocab().BOS != 2 || tk.Vocab().CLS != 2 || tk.Vocab().SEP != 3 {
		t.Errorf("BOS %d CLS %d SEP %d", tk.Vocab().BOS, tk.Vocab().CLS, tk.Vocab().SEP)
	}
	// Case kept when the vocabulary says so.
	tk2 := mustNew(t, md.with("tokenizer.ggml.normalizer.lowercase", false))
	if got, _ := tk2.Encode("Hello", false, false); !slices.Equal(got, []int32{1}) {
		t.Errorf("cased: %v", got)
	}
}

func TestSpecialIDOutOfRange(t *testing.T) {
	md := exampleVocab().with("tokenizer.ggml.eos_token_id", int64(4294967295)).with("tokenizer.ggml.seperator_token_id", int64(-1))
	tk := mustNew(t, md)
	if v := tk.Vocab(); v.EOS != 2 || v.SEP != NoToken {
		t.Errorf("EOS %d SEP %d", v.EOS, v.SEP)
	}
}

// TestEncodeAllocs: encoding reuses its working memory, so a call costs only the result.
func TestEncodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	tk := mustNew(t, byteLevelVocab())
	text := strings.Repeat("hello world, héllo again! ", 20)
	dst := make([]int32, 0, 4096)
	tk.AppendEncode(dst, text, true, true) // warm the scratch pool
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := tk.AppendEncode(dst[:0], text, true, true); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("AppendEncode allocates %v times per call", allocs)
	}
}

// TestConcurrentEncode: one Tokenizer serves many goroutines (run with -race).
func TestConcurrentEncode(t *testing.T) {
	tk := mustNew(t, byteLevelVocab())
	texts := []string{"say hello", "héllo<|endoftext|>hello", strings.Repeat("hello world ", 50)}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i], _ = tk.Encode(s, true, true)
	}
	done := make(chan error)
	for g := 0; g < 4; g++ {
		go func() {
			for n := 0; n < 200; n++ {
				i := n % len(texts)
				got, err := tk.Encode(texts[i], true, true)
				if err == nil && !slices.Equal(got, want[i]) {
					err = errMismatch
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

var errMismatch = errors.New("concurrent Encode gave a different result")
