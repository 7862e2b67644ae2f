package parakeet

import (
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

func TestVocabText(t *testing.T) {
	v := NewVocab([][]byte{
		[]byte("<unk>"), []byte("\u2581he"), []byte("llo"), []byte("\u2581wor"), []byte("ld"), []byte("."),
		[]byte("\u2581."), []byte("_x"), []byte("\u2581\u2581a"), []byte("<s>"), []byte("a\u2581b"), {},
	})
	for _, c := range []struct {
		ids  []int32
		want string
	}{
		{[]int32{1, 2, 3, 4, 5}, "hello world."},
		{[]int32{0, 1, 2}, "hello"},       // <unk> yields nothing: the next piece is still the first
		{[]int32{9, 11, 8}, "a"},          // every "▁" before the first character is dropped
		{[]int32{2, 8}, "llo  a"},         // after the first piece each "▁" is a space
		{[]int32{10, 6}, "a b ."},         // "▁" inside a piece
		{[]int32{7, 12, -1, 3}, "_x wor"}, // "_" is kept; the blank and ids out of range add nothing
		{[]int32{}, ""},
	} {
		if got := v.Text(c.ids); got != c.want {
			t.Errorf("Text(%v) = %q, want %q", c.ids, got, c.want)
		}
	}
	if v.Size() != 12 || v.Blank() != 12 {
		t.Errorf("size %d, blank %d", v.Size(), v.Blank())
	}
	for id, want := range map[int32][2]bool{1: {true, false}, 2: {false, false}, 5: {false, true}, 6: {true, true},
		7: {true, false}, 12: {false, false}, -3: {false, false}} {
		if v.IsWordStart(id) != want[0] || v.IsPunctuation(id) != want[1] {
			t.Errorf("id %d: word start %v, punctuation %v, want %v", id, v.IsWordStart(id), v.IsPunctuation(id), want)
		}
	}
	if p, ok := v.Piece(3); !ok || p != "\u2581wor" {
		t.Errorf("Piece(3) = %q, %v", p, ok)
	}
	if _, ok := v.Piece(12); ok {
		t.Error("the blank has a piece")
	}
	for _, p := range []string{"(", "\u2581?", "_-", "\"", "{"} {
		if !isPunctuation(p) {
			t.Errorf("%q is not punctuation", p)
		}
	}
	for _, p := range []string{"..", "\u2581", "a", "\u2581a", "", "\u00bf"} {
		if isPunctuation(p) {
			t.Errorf("%q is punctuation", p)
		}
	}
}

// TestTranscriptTimes: times in 10 ms units, punctuation collapsed onto the last word's end, and
// no segment for a text without characters.
func TestTranscriptTimes(t *testing.T) {
	v := NewVocab([][]byte{[]byte("<unk>"), []byte("."), []byte("\u2581a"), []byte("b"), []byte(",")})
	toks := []Token{{ID: 1, Frame: 0, Dur: 1}, {ID: 2, Frame: 1, Dur: 2}, {ID: 3, Frame: 3}, {ID: 4, Frame: 3, Dur: 4}, {ID: 1, Frame: 7, Dur: 1}}
	s, ok := v.Segment(toks, 99)
	if !ok || s.Text != ". ab,." || s.T0 != 0 || s.T1 != 99 {
		t.Fatalf("segment %+v, %v", s, ok)
	}
	want := [][2]int64{{0, 8}, {8, 24}, {24, 24}, {24, 24}, {24, 24}}
	for i, w := range want {
		if toks[i].T0 != w[0] || toks[i].T1 != w[1] {
			t.Errorf("token %d: %d..%d, want %v", i, toks[i].T0, toks[i].T1, w)
		}
	}
	if !toks[1].WordStart || toks[2].WordStart {
		t.Error("word starts")
	}
	if _, ok := v.Segment([]Token{{ID: 0}}, 5); ok {
		t.Error("a segment of <unk> alone")
	}
	h := HParams{NAudioCtx: 5000}
	if h.SegmentEnd(5000, 625) != 5000 || h.SegmentEnd(5001, 626) != 626 {
		t.Error("SegmentEnd")
	}
}

// TestTranscriptReference assembles every reference decode's tokens (ids, frames, durations as
// whisper.cpp emitted them) into a segment and requires whisper.cpp's text, token times, word
// starts and segment times exactly. The pieces come from the references; a subtest checks them
// against the model files (the 0.6b one where sharedtest.ParakeetRandomModel allows it).
func TestTranscriptReference(t *testing.T) {
	h := HParams{NAudioCtx: 5000}
	punct := 0
	for _, tag := range refTags {
		for _, clip := range refClips {
			r := readRef(t, tag, clip)
			pieces := make([][]byte, r.BlankID)
			toks := make([]Token, len(r.Tokens))
			for i, w := range r.Tokens {
				pieces[w.ID] = []byte(w.Piece)
				toks[i] = Token{ID: w.ID, Frame: w.Frame, DurIdx: w.DurIdx, Dur: w.DurVal, P: float32(w.P), PLog: float32(w.PLog)}
			}
			v := NewVocab(pieces)
			s, ok := v.Segment(toks, h.SegmentEnd(r.NMelFrames, r.NEncFrames))
			if !ok || len(r.Segments) != 1 {
				t.Fatalf("%s/%s: segment %v, %d recorded", tag, clip, ok, len(r.Segments))
			}
			if s.Text != r.Text || s.Text != r.Segments[0].Text || s.T0 != r.Segments[0].T0 || s.T1 != r.Segments[0].T1 {
				t.Errorf("%s/%s: segment %d..%d %q, recorded %+v", tag, clip, s.T0, s.T1, s.Text, r.Segments[0])
			}
			for i, w := range r.Tokens {
				g := s.Tokens[i]
				if g.T0 != w.T0 || g.T1 != w.T1 || g.WordStart != w.WordStart {
					t.Errorf("%s/%s token %d (%q): %d..%d word start %v, recorded %d..%d %v", tag, clip, i, w.Piece, g.T0, g.T1, g.WordStart, w.T0, w.T1, w.WordStart)
				}
				if v.IsPunctuation(w.ID) {
					punct++
				}
			}
		}
	}
	t.Logf("%d punctuation tokens in the references", punct)
	for _, m := range []struct{ tag, shape string }{{"small-f32", "small"}, {"0.6b-v2-f32", "0.6b-v2"}} {
		t.Run("pieces/"+m.tag, func(t *testing.T) {
			f, err := Open(sharedtest.ParakeetRandomModel(t, m.shape, false))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, clip := range refClips {
				r := readRef(t, m.tag, clip)
				if f.Vocab.Blank() != r.BlankID {
					t.Fatalf("blank %d, recorded %d", f.Vocab.Blank(), r.BlankID)
				}
				for _, w := range r.Tokens {
					if p, _ := f.Vocab.Piece(w.ID); p != w.Piece {
						t.Errorf("%s: piece %d is %q in the file, %q in the reference", clip, w.ID, p, w.Piece)
					}
				}
			}
		})
	}
}
