package sentencepiece

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestStandInRuns: the ids recorded in the Pocket TTS reference runs (upstream encoded every
// chunk with SentencePiece 0.1.97), and the chunk text decoded back.
func TestStandInRuns(t *testing.T) {
	m := loadStandIn(t)
	dir := sharedtest.Path(t, "reference/tts")
	metas, _ := filepath.Glob(filepath.Join(dir, "*", "meta.json"))
	if len(metas) == 0 {
		t.Skip("no reference runs in " + dir)
	}
	chunks := 0
	for _, p := range metas {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Chunks []struct {
				Text     string  `json:"text"`
				TokenIDs []int32 `json:"token_ids"`
			} `json:"chunks"`
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, c := range meta.Chunks {
			chunks++
			if got := m.Encode(c.Text); !slices.Equal(got, c.TokenIDs) {
				t.Errorf("%s: Encode(%q) = %v, want %v", filepath.Base(filepath.Dir(p)), c.Text, got, c.TokenIDs)
			}
			if got, err := m.Decode(c.TokenIDs); err != nil || got != c.Text {
				t.Errorf("%s: Decode = %q, %v; want %q", filepath.Base(filepath.Dir(p)), got, err, c.Text)
			}
		}
	}
	if chunks == 0 {
		t.Fatal("no chunks read")
	}
	if m.Len() != 4000 || m.Trainer().VocabSize != 4000 || !m.Trainer().ByteFallback || m.Normalizer().Name != "nmt_nfkc" {
		t.Errorf("stand-in model: %d pieces, trainer %+v, normaliser %q", m.Len(), m.Trainer(), m.Normalizer().Name)
	}
}

// Pieces of generated text, by kind.
var (
	genWords = strings.Fields(`the quick brown fox jumps over lazy dog hello world speech synthesis
		streaming model license software program free copy distribute modify function return value
		Python module object string number list dictionary error exception Numbers March dates aloud
		whisper parley voice audio token chunk sentence Ready Streaming GNU General Public Version`)
	genAccented = strings.Fields(`café naïve résumé über Straße façade jalapeño smörgåsbord Ærø Øl
		crème brûlée São Paulo Dvořák Łódź İstanbul ŞİŞLİ Ångström coöperate`)
	genCombining = []string{"e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "A\u030a", "i\u0307", "z\u030c"}
	genPunct     = []string{".", ",", ";", ":", "!", "?", "...", "…", "—", "–", "-", "'", "\"", "“", "”", "‘", "’",
		"(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=",
		"~", "`", "«", "»", "¿", "¡", "§", "¶", "•", "°", "€", "£", "¥", "©", "®", "™"}
	genSpaces = []string{" ", "  ", "   ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2009", "\u200b",
		"\u202f", "\u205f", "\u2028", " \t ", "\v", "\f", "\u0085"}
	genEmoji = []string{"😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "☕", "🎉", "🦙", "✅", "🔥", "🙂"}
	genCJK   = []string{"漢字", "日本語", "中文", "한국어", "ひらがな", "カタカナ", "ｶﾀｶﾅ", "你好世界", "東京", "北京"}
	genOther = []string{"Привет", "Ελληνικά", "مرحبا", "שלום", "हिन्दी", "ไทย", "Ａｂｃ１２３", "①②③", "ﬁ ﬂ ﬀ",
		"Ⅻ", "½ ¾ ⅓", "x²", "H₂O", "㎏", "℃", "ǅ", "ß", "ı", "İ", "\u0000", "\u0007", "\u001f", "\u007f", "\ufeff",
		"\ue000", "\U0001d400", "\U00010348", "\U0010fffd"}
)

// genText builds one text of random pieces of every kind, with a random code point now and then
// (mostly outside the vocabulary: byte fallback).
func genText(r *rand.Rand) string {
	var sb strings.Builder
	n := 1 + r.IntN(12)
	for range n {
		switch k := r.IntN(20); {
		case k < 6:
			w := genWords[r.IntN(len(genWords))]
			if r.IntN(5) == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			sb.WriteString(w)
		case k < 8:
			sb.WriteString(genAccented[r.IntN(len(genAccented))])
		case k < 9:
			sb.WriteString(genCombining[r.IntN(len(genCombining))])
		case k < 11:
			fmt.Fprintf(&sb, "%d", r.IntN(100000))
			if r.IntN(3) == 0 {
				fmt.Fprintf(&sb, ".%d", r.IntN(100))
			}
		case k < 13:
			sb.WriteString(genPunct[r.IntN(len(genPunct))])
		case k < 15:
			sb.WriteString(genSpaces[r.IntN(len(genSpaces))])
		case k < 16:
			sb.WriteString(genEmoji[r.IntN(len(genEmoji))])
		case k < 17:
			sb.WriteString(genCJK[r.IntN(len(genCJK))])
		case k < 18:
			sb.WriteString(genOther[r.IntN(len(genOther))])
		default:
			for {
				c := rune(r.IntN(0x30000))
				if r.IntN(4) == 0 {
					c = rune(r.IntN(0x800))
				}
				if utf8.ValidRune(c) {
					sb.WriteRune(c)
					break
				}
			}
		}
		if r.IntN(3) > 0 {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

// TestAgainstSentencePiece compares Encode and Decode with SentencePiece itself (python3's
// sentencepiece module) on generated texts and on random id lists, for the stand-in model and
// for models built here that use what it does not (no byte fallback, user-defined and unused
// pieces, collapsed whitespace, no normaliser, whitespace as suffix, a denormaliser).
func TestAgainstSentencePiece(t *testing.T) {
	py := python(t)
	m := loadStandIn(t)
	path := sharedtest.Path(t, standInPath)
	r := rand.New(rand.NewPCG(1, 2))
	texts := []string{"", " ", "  leading", "trailing  ", "a  b", "\n", "Hello world.", "hello", "        Hello"}
	nText := 3000
	if testing.Short() {
		nText = 300
	}
	for len(texts) < nText {
		texts = append(texts, genText(r))
	}
	decode := randomIDs(r, m.Len(), 1000)
	compare(t, "stand-in", py, path, m, texts, decode)

	charsmap := m.Normalizer().PrecompiledCharsmap
	words := []synthPiece{
		{"▁", -2, Normal}, {"▁the", -3, Normal}, {"▁a", -3.5, Normal}, {"a", -4, Normal}, {"b", -4.5, Normal},
		{"c", -5, Normal}, {"t", -5, Normal}, {"h", -5, Normal}, {"e", -4, Normal}, {"he", -6, Normal},
		{"th", -6, Normal}, {"▁th", -7, Normal}, {"the", -6.5, Normal}, {"ab", -6, Normal}, {"abc", -6, Normal},
		{"<sep>", 0, UserDefined}, {"@@", 0, UserDefined}, {"▁b", -2, Unused}, {"1", -8, Normal}, {"2", -8, Normal},
		{"12", -9, Normal}, {".", -3, Normal}, {",", -3, Normal}, {"▁▁", -10, Normal},
	}
	models := map[string]synthModel{
		"no byte fallback, collapsed whitespace": {pieces: basePieces(false, words...), normName: "nmt_nfkc", charsmap: charsmap, dummyPrefix: true, removeExtra: true, escape: true},
		"identity, bytes, no dummy prefix":       {pieces: basePieces(true, words...), byteFallback: true, normName: "identity", escape: true},
		"identity, spaces not escaped":           {pieces: basePieces(false, words...), normName: "identity", dummyPrefix: true},
		"whitespace as suffix":                   {pieces: basePieces(true, words...), byteFallback: true, normName: "nmt_nfkc", charsmap: charsmap, dummyPrefix: true, escape: true, asSuffix: true},
		"denormaliser":                           {pieces: basePieces(true, words...), byteFallback: true, normName: "nmt_nfkc", charsmap: charsmap, dummyPrefix: true, escape: true, denormMap: charsmap},
	}
	small := []string{"the abc", "  the  a b  c  ", "<sep>the@@a<sep>", "xyz the", "thethe", "ab ab abc", "12 1 2 21",
		"éé the", "the.", "a,b", "   ", "▁the", "ｔｈｅ①"}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range models {
			if !yield(k) {
				return
			}
		}
	}) {
		sm := models[name]
		b := sm.bytes()
		p := filepath.Join(t.TempDir(), "m.model")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		mm, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		tx := append(slices.Clone(small), texts[:min(500, len(texts))]...)
		compare(t, name, py, p, mm, tx, randomIDs(r, mm.Len(), 300))
	}
}

// randomIDs returns n id lists: runs of byte pieces (often malformed UTF-8), control and
// unknown pieces, and words.
func randomIDs(r *rand.Rand, vocab, n int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		k := r.IntN(12)
		ids := make([]int32, k)
		for j := range ids {
			if r.IntN(3) == 0 {
				ids[j] = int32(r.IntN(min(vocab, 262)))
			} else {
				ids[j] = int32(r.IntN(vocab))
			}
		}
		out[i] = ids
	}
	return out
}

func compare(t *testing.T, name, py, path string, m *Model, texts []string, decode [][]int32) {
	t.Helper()
	res := runSPM(t, py, path, texts, decode)
	encOK, decOK := 0, 0
	shown := 0
	for i, text := range texts {
		got := m.Encode(text)
		want := res.IDs[i]
		if len(got) == 0 && len(want) == 0 || slices.Equal(got, want) {
			encOK++
			continue
		}
		if shown++; shown <= 10 {
			t.Errorf("%s: Encode(%q)\n got  %v\n want %v", name, text, got, want)
		}
	}
	for i, ids := range decode {
		got, err := m.Decode(ids)
		if err == nil && got == res.Decoded[i] {
			decOK++
			continue
		}
		if shown++; shown <= 10 {
			t.Errorf("%s: Decode(%v) = %q, %v; want %q", name, ids, got, err, res.Decoded[i])
		}
	}
	t.Logf("%s: SentencePiece %s agrees on %d/%d encoded texts and %d/%d decoded id lists",
		name, res.Version, encOK, len(texts), decOK, len(decode))
}

// TestSynthetic checks behaviours by hand on a small model.
func TestSynthetic(t *testing.T) {
	words := []synthPiece{{"▁a", -1, Normal}, {"b", -2, Normal}, {"▁ab", -2.5, Normal}, {"<x>", 0, UserDefined}}
	m, err := Parse(synthModel{pieces: basePieces(false, words...), normName: "identity", dummyPrefix: true, escape: true}.bytes())
	if err != nil {
		t.Fatal(err)
	}
	unk := m.UnknownID()
	for _, c := range []struct {
		text string
		want []int32
	}{
		{"ab", []int32{5}},           // ▁ab (-2.5) beats ▁a b (-3)
		{"a<x>b", []int32{3, 6, 4}},  // the user-defined piece is taken whole
		{"azzb", []int32{3, unk, 4}}, // a run of unknown characters is one unknown piece
		{"", nil},
	} {
		if got := m.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if s, err := m.Decode([]int32{3, unk, 1, 4}); err != nil || s != "a ⁇ b" {
		t.Errorf("Decode = %q, %v", s, err)
	}
	if _, err := m.Decode([]int32{7}); err == nil {
		t.Error("an id past the vocabulary decoded")
	}
	if id := m.ID("▁ab"); id != 5 {
		t.Errorf("ID(▁ab) = %d", id)
	}
	if id := m.ID("nope"); id != unk {
		t.Errorf("ID of a missing piece = %d", id)
	}
	if p, ok := m.Piece(4); !ok || p.Text != "b" || p.Type != Normal || p.Score != -2 {
		t.Errorf("Piece(4) = %+v %v", p, ok)
	}
}

// TestRefused: malformed and unsupported models are refused with a clear error.
func TestRefused(t *testing.T) {
	ok := synthModel{pieces: basePieces(true, synthPiece{"▁a", -1, Normal}), byteFallback: true, normName: "identity", dummyPrefix: true, escape: true}
	if _, err := Parse(ok.bytes()); err != nil {
		t.Fatal(err)
	}
	mod := func(f func(*synthModel)) []byte {
		s := ok
		s.pieces = slices.Clone(ok.pieces)
		f(&s)
		return s.bytes()
	}
	good := ok.bytes()
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"bpe", mod(func(s *synthModel) { s.modelType = BPE }), "only unigram"},
		{"no charsmap", mod(func(s *synthModel) { s.normName = "nfkc" }), "no precompiled charsmap"},
		{"bad charsmap", mod(func(s *synthModel) { s.normName = "nfkc"; s.charsmap = []byte{8, 0, 0, 0, 1} }), "charsmap"},
		{"no unk", mod(func(s *synthModel) { s.pieces = s.pieces[1:] }), "no unknown piece"},
		{"two unk", mod(func(s *synthModel) { s.pieces = append(s.pieces, synthPiece{"<unk2>", 0, Unknown}) }), "two unknown"},
		{"dup", mod(func(s *synthModel) { s.pieces = append(s.pieces, synthPiece{"▁a", -2, Normal}) }), "already defined"},
		{"empty piece", mod(func(s *synthModel) { s.pieces = append(s.pieces, synthPiece{"", -2, Normal}) }), "empty"},
		{"missing byte", mod(func(s *synthModel) { s.pieces = slices.Delete(s.pieces, 10, 11) }), "255 byte pieces"},
		{"bytes without fallback", mod(func(s *synthModel) { s.byteFallback = false }), "without byte_fallback"},
		{"bad byte piece", mod(func(s *synthModel) { s.pieces[3].text = "<0xzz>" }), "not <0xNN>"},
		{"no normal piece", mod(func(s *synthModel) { s.pieces = s.pieces[:len(s.pieces)-1] }), "no normal"},
		{"truncated", good[:len(good)-3], "ModelProto"},
		{"bad wire type", append([]byte{0x0d, 1, 2, 3, 4}, good...), "wire type"}, // field 1 as fixed32
		{"bad piece type", mod(func(s *synthModel) { s.pieces[3].typ = 9 }), "unknown piece type"},
	}
	for _, c := range cases {
		_, err := Parse(c.b)
		if err == nil {
			t.Errorf("%s: parsed", c.name)
			continue
		}
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an ErrFormat containing %q", c.name, err, c.want)
		}
	}
}
