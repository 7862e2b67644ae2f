package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// wpmReference is encodeWPM written plainly, word strings first and then the greedy cover, with
// no shared buffers or byte offsets: the fuzz test holds the two to the same ids.
func wpmReference(t *Tokenizer, text string) []int32 {
	var words []string
	var cur strings.Builder
	end := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	for _, r := range appendCodePoints(nil, text) {
		if t.nfd {
			r = nfdFirst(r)
		}
		c := class(r)
		switch {
		case c&clsSpace != 0:
			end()
		case r == 0 || r == utf8.RuneError || c&clsCatMask == clsControl:
		case t.dropMarks && c&clsCatMask == clsMark:
		default:
			if t.lowercase {
				r = lowerRune(r)
			}
			s := string(appendRune(nil, r))
			if c&clsCatMask == clsPunct || (r < 0x7F && c&clsCatMask == clsSymbol) || isChineseChar(r) {
				end()
				words = append(words, s)
			} else {
				cur.WriteString(s)
			}
		}
	}
	end()
	var out []int32
	for _, w := range words {
		w = "\u2581" + w
		var ids []int32
		for len(w) > 0 {
			n := min(len(w), t.maxTokenLen+1)
			for ; n > 0; n-- {
				if id, ok := t.toID[w[:n]]; ok {
					ids = append(ids, id)
					break
				}
			}
			if n == 0 {
				ids = nil
				break
			}
			w = w[n:]
		}
		if ids == nil && t.vocab.UNK != NoToken {
			ids = []int32{t.vocab.UNK}
		}
		out = append(out, ids...)
	}
	return out
}

// wordPieceVocab is a small WordPiece vocabulary as GGUF stores one (word-initial pieces after
// U+2581, "##" continuations bare) over "cafe", Devanagari and a few CJK and punctuation tokens.
func wordPieceVocab() mapMeta {
	return wordPieceMeta([]string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁cafe", "▁caf", "e", "▁न", "म", "स", "त",
		"▁.", "▁日", "▁ab", "▁Cafe", "▁Café", "▁a", "b", "▁!", "▁‽"})
}

// wordPieceMeta is the metadata of an uncased BERT vocabulary of tokens whose first four are
// [PAD], [UNK], [CLS] and [SEP] (control tokens), the rest normal.
func wordPieceMeta(tokens []string) mapMeta {
	types := make([]int64, len(tokens))
	for i := range types {
		types[i] = int64(TypeNormal)
	}
	for i := 0; i < 4; i++ {
		types[i] = int64(TypeControl)
	}
	return mapMeta{
		"tokenizer.ggml.model":              "bert",
		"tokenizer.ggml.tokens":             tokens,
		"tokenizer.ggml.token_type":         types,
		"tokenizer.ggml.unknown_token_id":   int64(1),
		"tokenizer.ggml.cls_token_id":       int64(2),
		"tokenizer.ggml.seperator_token_id": int64(3),
		"tokenizer.ggml.padding_token_id":   int64(0),
	}
}

// TestWordPieceNormalizer: the normalisation with and without the normaliser keys (see
// setNormalizer). The ids without keys are llama-tokenize's (llama.cpp c392e509, --ids
// --no-escape) on wordPieceVocab written as a GGUF file, with tokenizer.ggml.bos_token_id 2 added
// because c392e509 does not take BOS from cls_token_id. Those with keys follow
// llm_tokenizer_wpm_session after ggml-org/llama.cpp#24371, which c392e509 predates.
func TestWordPieceNormalizer(t *testing.T) {
	const text = "Cafe\u0301 Café नमस्ते a\u200bb ca\u0378fe 日. ‽!"
	for _, c := range []struct {
		name string
		md   mapMeta
		want []int32
	}{
		// Marks kept: "cafe"+U+0301 and the Devanagari word have no cover; zero-width space
		// dropped; the unassigned U+0378 joins its word.
		{"no keys", wordPieceVocab(), []int32{2, 1, 4, 1, 13, 1, 12, 11, 19, 18, 3}},
		{"strip_accents", wordPieceVocab().with(keyAccents, true), []int32{2, 4, 4, 7, 8, 9, 10, 13, 1, 12, 11, 19, 18, 3}},
		{"lowercase", wordPieceVocab().with(keyLower, true), []int32{2, 4, 4, 7, 8, 9, 10, 13, 1, 12, 11, 19, 18, 3}},
		// Neither lower case nor NFD: "Café" is found as it is written.
		{"cased", wordPieceVocab().with(keyLower, false), []int32{2, 1, 15, 1, 13, 1, 12, 11, 19, 18, 3}},
		{"cased, accents stripped", wordPieceVocab().with(keyLower, false).with(keyAccents, true), []int32{2, 14, 14, 7, 8, 9, 10, 13, 1, 12, 11, 19, 18, 3}},
	} {
		tk := mustNew(t, c.md)
		got, err := tk.Encode(text, true, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: Encode(%q) = %v, want %v", c.name, text, got, c.want)
		}
		if ref := wpmReference(tk, text); !slices.Equal(got[1:len(got)-1], ref) {
			t.Errorf("%s: Encode(%q) = %v, plain reference %v", c.name, text, got, ref)
		}
	}
}

// TestWordPieceReference encodes text of many kinds with the shared bert-bge vocabulary. The ids
// are llama-tokenize's (llama.cpp c392e5094deaf2d1a7c18683214f007fad3fe42b, CPU build, run as
// llama-tokenize -m ggml-vocab-bert-bge.gguf -f FILE --ids --no-escape, so with [CLS]/[SEP] and
// special tokens parsed): Encode(text, true, true). Without normaliser keys, as here, llama.cpp
// keeps marks, so a word holding one that the vocabulary lacks is [UNK]; NFD maps each code
// point to its first (é to e, 가 to ᄀ); zero-width and other Cc/Cf/Co characters vanish;
// unassigned code points stay in their word.
func TestWordPieceReference(t *testing.T) {
	tk := loadTokenizer(t, vocabPath(t, "ggml-vocab-bert-bge.gguf"))
	for _, c := range []struct {
		class, text string
		want        []int32
	}{
		{"latin-precomposed", "Crème brûlée à la Française, São Paulo, Ærøskøbing", []int32{101, 13675, 21382, 7987, 9307, 2063, 1037, 2474, 18427, 1010, 7509, 9094, 1010, 1097, 2099, 16415, 6711, 16415, 10472, 102}},
		{"latin-combining", "Cre\u0300me bru\u0302le\u0301e, Sa\u0303o Paulo, nai\u0308ve", []int32{101, 100, 100, 1010, 100, 9094, 1010, 100, 102}},
		{"latin-combining", "cafe\u0301 café", []int32{101, 100, 7668, 102}},
		{"cyrillic-greek", "Йод и\u0306од ΆΣΤΡΑ α\u0301στρα", []int32{101, 1188, 14150, 29742, 100, 1155, 29733, 29734, 29732, 14608, 100, 102}},
		{"devanagari", "नमस्ते दुनिया", []int32{101, 100, 100, 102}},
		{"devanagari", "क़लम हिन्दी", []int32{101, 100, 100, 102}},
		{"thai", "สวัสดีครับ ภาษาไทย ก่อน ที่", []int32{101, 100, 100, 100, 100, 102}},
		{"arabic", "مرحبا بالعالم السَّلَامُ عَلَيْكُمْ", []int32{101, 1295, 17149, 29820, 29816, 25573, 1271, 25573, 23673, 29830, 25573, 23673, 22192, 100, 100, 102}},
		{"hebrew", "שלום עולם שָׁלוֹם", []int32{101, 1266, 29799, 29792, 29800, 1259, 29792, 29799, 29800, 100, 102}},
		{"hangul", "안녕하세요 세계 가", []int32{101, 1463, 29992, 30005, 29997, 29999, 1461, 29991, 1455, 30006, 102}},
		{"kana", "ひらがな カタカナ ｶﾀｶﾅ ガ か\u3099", []int32{101, 1673, 30211, 30177, 30193, 1700, 30235, 30226, 30241, 100, 1700, 100, 102}},
		{"cjk", "中文字符 日本語 𠀀𫠠𬺰 \U0002B820x", []int32{101, 1746, 1861, 100, 100, 1864, 1876, 1950, 100, 100, 100, 102}},
		{"emoji", "👍🏽 👨\u200d👩\u200d👧 🇫🇷 ❤\ufe0f ☺ ©\ufe0f", []int32{101, 100, 100, 100, 100, 100, 100, 102}},
		{"symbols", "∑∫√ ≤≥ €£¥ ©®™ $+<=>^`|~ ½", []int32{101, 100, 1608, 30136, 1574, 29646, 29648, 1075, 29656, 30108, 1002, 1009, 1026, 1027, 1028, 1034, 1036, 1064, 1066, 1092, 102}},
		{"punctuation", "a_b‿c -–— ([{「 )]}」 «‘“ »’” !?¿¡‽。、・ ⸘", []int32{101, 1037, 1035, 1038, 1534, 1039, 1011, 1516, 1517, 1006, 1031, 1063, 1641, 1007, 1033, 1065, 1642, 1077, 1520, 1523, 1090, 1521, 1524, 999, 1029, 1094, 1067, 100, 1636, 1635, 1738, 100, 102}},
		{"control", "a\x01b\x7fc\u009fd\u0085e\x1bf", []int32{101, 5925, 2094, 1041, 2546, 102}},
		{"zero-width", "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffjoiner\u00adsoft", []int32{101, 5717, 9148, 11927, 7295, 2239, 5558, 26455, 18351, 5558, 26455, 6499, 6199, 102}},
		{"unassigned", "x\u0378y z\U000e0080w \U0002ebf0", []int32{101, 100, 100, 100, 102}},
		{"private-use", "a\ue000b \U000f0000", []int32{101, 11113, 102}},
		{"mixed", "Hello世界 नमस्ते123 привет! cafe\u0301-bar", []int32{101, 7592, 1745, 100, 100, 1194, 16856, 10325, 25529, 15290, 22919, 999, 100, 1011, 3347, 102}},
		{"long-word", "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianisme\u0301", []int32{101, 1052, 2638, 2819, 17175, 11314, 6444, 2594, 7352, 26461, 27572, 11261, 6767, 15472, 6761, 8663, 10735, 2483, 100, 102}},
		{"whitespace", "  \t\n\r\n \u00a0\u3000a \u2028 b\u2029\u1680c\u202f\u205fd\u000b\u000c", []int32{101, 1037, 1038, 1039, 1040, 102}},
		{"malformed", "a\xffb\xed\xa0\x80c\x00d\ufffde", []int32{101, 5925, 3207, 102}},
	} {
		got, err := tk.Encode(c.text, true, true)
		if err != nil {
			t.Errorf("%s: %q: %v", c.class, c.text, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %q\n want %v\n  got %v", c.class, c.text, c.want, got)
		}
	}
}
