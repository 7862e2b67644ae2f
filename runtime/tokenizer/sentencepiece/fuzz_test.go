package sentencepiece

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

func fuzzWords() []synthPiece {
	return []synthPiece{{"▁", -2, Normal}, {"▁a", -1, Normal}, {"b", -2, Normal}, {"▁ab", -2.5, Normal},
		{"<x>", 0, UserDefined}, {"c", -3, Unused}, {"é", -4, Normal}}
}

// FuzzParse: any bytes parse or fail with ErrFormat, never panic; a model that parses encodes and
// decodes without panicking and gives ids inside its vocabulary.
func FuzzParse(f *testing.F) {
	f.Add(synthModel{pieces: basePieces(true, fuzzWords()...), byteFallback: true, normName: "identity", dummyPrefix: true, escape: true}.bytes())
	f.Add(synthModel{pieces: basePieces(false, fuzzWords()...), normName: "identity", removeExtra: true}.bytes())
	f.Add(synthModel{pieces: basePieces(false, fuzzWords()...), normName: "x", charsmap: []byte{4, 0, 0, 0, 0, 0, 0, 0, 0}}.bytes())
	f.Add([]byte{})
	if d := sharedtest.Lookup(); d != "" {
		if b, err := os.ReadFile(filepath.Join(d, standInPath)); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		for _, s := range []string{"", "ab a<x>b", "  é\u00a0\xff", "hello world 123"} {
			ids := m.Encode(s)
			for _, id := range ids {
				if id < 0 || int(id) >= m.Len() {
					t.Fatalf("Encode(%q) gave id %d of %d", s, id, m.Len())
				}
			}
			if _, err := m.Decode(ids); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzEncode: any text encodes to ids in the vocabulary, and for the byte-fallback models here
// (nothing is unknown) decoding gives back the normalised text with U+2581 read as a space and
// the dummy prefix removed.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello world.", "  a  b  ", "\xff\xfe", "ｈｅｌｌｏ ﬁ é 😀 漢字", "▁▁x", "a<x>b", "\u0000\t\n"} {
		f.Add(s)
	}
	models := []*Model{}
	m, err := Parse(synthModel{pieces: basePieces(true, fuzzWords()...), byteFallback: true, normName: "identity", dummyPrefix: true, escape: true}.bytes())
	if err != nil {
		f.Fatal(err)
	}
	models = append(models, m)
	if d := sharedtest.Lookup(); d != "" {
		if sm, err := Load(filepath.Join(d, standInPath)); err == nil {
			models = append(models, sm)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range models {
			ids := m.Encode(s)
			for _, id := range ids {
				if id < 0 || int(id) >= m.Len() {
					t.Fatalf("Encode(%q) gave id %d", s, id)
				}
			}
			got, err := m.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			norm := m.Normalize(s)
			want := strings.ReplaceAll(strings.TrimPrefix(norm, spaceSymbol), spaceSymbol, " ")
			if got != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want %q (normalised %q, ids %v)", s, got, want, norm, ids)
			}
		}
	})
}
