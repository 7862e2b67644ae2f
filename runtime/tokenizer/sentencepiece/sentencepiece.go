// Package sentencepiece reads SentencePiece model files (the protobuf ModelProto that spm_train
// writes, "tokenizer.model") and encodes and decodes text with unigram models exactly as
// SentencePiece 0.1.97 does (sentencepiece_processor.cc, unigram_model.cc, normalizer.cc):
//
//   - normalisation by the model's precompiled charsmap (the double-array trie spm_train compiles
//     from nmt_nfkc, nfkc or a rule file), user-defined symbols kept whole, the dummy-prefix
//     space, removal of extra whitespace, and spaces escaped to U+2581, each as the
//     normalizer_spec says;
//   - Viterbi segmentation over the pieces by score (the optimised encoder), unknown characters
//     scored min_score - 10, and expanded to <0xNN> byte pieces where the model has byte fallback
//     (merged into one unknown piece where it has not);
//   - decoding ids to text: byte pieces reassembled into UTF-8 (U+FFFD for a malformed byte),
//     control pieces dropped, the unknown piece written as " ⁇ ", the leading dummy-prefix space
//     removed.
//
// It is separate from package tokenizer, which reproduces llama.cpp's tokenizers over GGUF
// vocabularies: this one runs a model file as SentencePiece itself does, for models that ship
// one (Pocket TTS). A Model is immutable and safe for concurrent use.
package sentencepiece

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// MaxFileSize bounds the model files Load reads.
const MaxFileSize = 1 << 30

// unkPenalty is subtracted from the lowest piece score to score an unknown character
// (unigram_model.cc, kUnkPenalty).
const unkPenalty float32 = 10

// Model is a loaded unigram SentencePiece model.
type Model struct {
	pieces   []Piece
	trainer  TrainerSpec
	normSpec NormalizerSpec
	norm     *normalizer
	denorm   *normalizer // nil unless the file has a denormalizer charsmap

	trie     *trie            // normal, user-defined and unused pieces
	normal   map[string]int32 // the same pieces by text
	reserved map[string]int32 // control, unknown and byte pieces by text
	unk      int32
	byteIDs  [256]int32 // <0xNN> piece of each byte (byte fallback only)
	minScore float32    // over normal pieces
	maxScore float32    // over normal pieces, at least FLT_MIN as SentencePiece starts it

	raw []byte // the file's bytes
}

// Load reads and parses the model file at path.
func Load(path string) (*Model, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("sentencepiece: %w", err)
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("sentencepiece: %s: %d bytes is larger than the %d-byte limit", path, fi.Size(), MaxFileSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sentencepiece: %w", err)
	}
	m, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ErrFormat is wrapped by every error that reports a malformed or unsupported model.
var ErrFormat = errors.New("sentencepiece: bad model")

type formatError struct{ err error }

func (e *formatError) Error() string { return "sentencepiece: " + e.err.Error() }
func (e *formatError) Unwrap() []error {
	return []error{ErrFormat, e.err}
}

func bad(format string, args ...any) error {
	return &formatError{fmt.Errorf(format, args...)}
}

// Parse parses a serialized ModelProto. The Model keeps a copy of b (Bytes returns it).
func Parse(b []byte) (*Model, error) {
	p, err := parseModelProto(b)
	if err != nil {
		return nil, &formatError{err}
	}
	if p.trainer.ModelType != Unigram {
		return nil, bad("model type %v is not supported (only unigram)", p.trainer.ModelType)
	}
	m := &Model{
		pieces:   p.pieces,
		trainer:  p.trainer,
		normSpec: p.normalizer,
		trie:     newTrie(),
		normal:   map[string]int32{},
		reserved: map[string]int32{},
		unk:      -1,
		minScore: math.MaxFloat32,
		maxScore: 0x1p-126, // FLT_MIN, the smallest normal float
		raw:      append([]byte(nil), b...),
	}
	if len(m.pieces) > math.MaxInt32 {
		return nil, bad("%d pieces", len(m.pieces))
	}
	var user []string
	byteFound := 0
	for i := range m.pieces {
		pc := &m.pieces[i]
		id := int32(i)
		if pc.Text == "" {
			return nil, bad("piece %d is empty", i)
		}
		dst := m.reserved
		switch pc.Type {
		case Normal, UserDefined, Unused:
			dst = m.normal
		}
		if _, dup := dst[pc.Text]; dup {
			return nil, bad("piece %d (%q) is already defined", i, pc.Text)
		}
		dst[pc.Text] = id
		switch pc.Type {
		case Normal:
			m.minScore = min(m.minScore, pc.Score)
			m.maxScore = max(m.maxScore, pc.Score)
		case UserDefined:
			user = append(user, pc.Text)
		case Unknown:
			if m.unk >= 0 {
				return nil, bad("two unknown pieces (%d and %d)", m.unk, i)
			}
			m.unk = id
		case Byte:
			if !m.trainer.ByteFallback {
				return nil, bad("byte piece %d (%q) in a model without byte_fallback", i, pc.Text)
			}
			v, ok := pieceToByte(pc.Text)
			if !ok {
				return nil, bad("byte piece %d (%q) is not <0xNN>", i, pc.Text)
			}
			m.byteIDs[v] = id // duplicates were refused above
			byteFound++
		}
		if pc.Type == Normal || pc.Type == UserDefined || pc.Type == Unused {
			m.trie.insert(pc.Text, id)
		}
	}
	if m.unk < 0 {
		return nil, bad("no unknown piece")
	}
	if m.trainer.ByteFallback && byteFound != 256 {
		return nil, bad("byte_fallback is set but there are %d byte pieces, not 256", byteFound)
	}
	if len(m.normal) == 0 {
		return nil, bad("no normal, user-defined or unused piece to segment with")
	}
	// Byte pieces are looked up as SentencePiece's PieceToId does (reserved pieces first).
	if m.trainer.ByteFallback {
		for b := range 256 {
			m.byteIDs[b] = m.ID(byteToPiece(byte(b)))
		}
	}
	var userTrie *trie
	if len(user) > 0 {
		userTrie = newTrie()
		for _, u := range user {
			userTrie.insert(u, 0)
		}
	}
	if m.norm, err = newNormalizer(p.normalizer, p.trainer.TreatWhitespaceAsSuffix, userTrie); err != nil {
		return nil, &formatError{fmt.Errorf("normalizer_spec: %w", err)}
	}
	if p.hasDenormSpec && len(p.denormalizer.PrecompiledCharsmap) > 0 {
		if m.denorm, err = newNormalizer(p.denormalizer, false, nil); err != nil {
			return nil, &formatError{fmt.Errorf("denormalizer_spec: %w", err)}
		}
	}
	return m, nil
}

func byteToPiece(b byte) string { return fmt.Sprintf("<0x%02X>", b) }

// pieceToByte parses "<0xNN>" with upper-case hex digits, as SentencePiece's PieceToByte.
func pieceToByte(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(s[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

// Bytes returns the serialized model, as read.
func (m *Model) Bytes() []byte { return m.raw }

// Len returns the number of pieces (the vocabulary size).
func (m *Model) Len() int { return len(m.pieces) }

// Piece returns the piece with id id; ok is false if id is out of range.
func (m *Model) Piece(id int32) (p Piece, ok bool) {
	if id < 0 || int(id) >= len(m.pieces) {
		return Piece{}, false
	}
	return m.pieces[id], true
}

// ID returns the id of the piece spelled s (control, unknown and byte pieces first), or the
// unknown piece's id, as SentencePiece's PieceToId.
func (m *Model) ID(s string) int32 {
	if id, ok := m.reserved[s]; ok {
		return id
	}
	if id, ok := m.normal[s]; ok {
		return id
	}
	return m.unk
}

// UnknownID returns the unknown piece's id.
func (m *Model) UnknownID() int32 { return m.unk }

// Trainer returns the model's trainer settings.
func (m *Model) Trainer() TrainerSpec { return m.trainer }

// Normalizer returns the model's normalizer settings (the charsmap slice is the model's own).
func (m *Model) Normalizer() NormalizerSpec { return m.normSpec }

// Normalize returns text as the model's normaliser writes it before segmentation.
func (m *Model) Normalize(text string) string { return m.norm.normalize(text) }

// oneCharLen is SentencePiece's OneCharLen: the UTF-8 length its lead byte announces (1 for a
// continuation byte).
func oneCharLen(b byte) int {
	return int("\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x01\x02\x02\x03\x04"[b>>4])
}

type bestPath struct {
	score float32
	start int32 // -1: not reached
	id    int32
}

// Encode returns the ids of text, as SentencePieceProcessor.encode(text) (no BOS or EOS).
// Any bytes are accepted: malformed UTF-8 is normalised to U+FFFD as SentencePiece does.
func (m *Model) Encode(text string) []int32 {
	norm := m.norm.normalize(text)
	if norm == "" {
		return nil
	}
	n := len(norm)
	best := make([]bestPath, n+1)
	for i := range best {
		best[i].start = -1
	}
	unkScore := m.minScore - unkPenalty
	for s := 0; s < n; {
		mblen := min(oneCharLen(norm[s]), n-s)
		till := best[s].score
		single := false
		node := int32(0)
		for k := s; k < n; k++ {
			node = m.trie.child(node, norm[k])
			if node < 0 {
				break
			}
			id := m.trie.value[node]
			if id < 0 {
				continue
			}
			pc := &m.pieces[id]
			if pc.Type == Unused {
				continue
			}
			length := k + 1 - s
			// The C++ conditional's type is double, so both branches add in double precision.
			var score float64
			if pc.Type == UserDefined {
				score = float64(float32(length)*m.maxScore) - 0.1
			} else {
				score = float64(pc.Score)
			}
			cand := score + float64(till)
			t := &best[k+1]
			if t.start == -1 || cand > float64(t.score) {
				t.score, t.start, t.id = float32(cand), int32(s), id
			}
			if length == mblen {
				single = true
			}
		}
		if !single {
			cand := unkScore + till // float arithmetic, as in C++
			t := &best[s+mblen]
			if t.start == -1 || cand > t.score {
				t.score, t.start, t.id = cand, int32(s), m.unk
			}
		}
		s += mblen
	}
	// Backtrack, then expand unknown pieces.
	var segs []int32 // ends, reversed
	for end := n; end > 0; end = int(best[end].start) {
		segs = append(segs, int32(end))
	}
	ids := make([]int32, 0, len(segs))
	prevUnk := false
	for i := len(segs) - 1; i >= 0; i-- {
		end := int(segs[i])
		b := best[end]
		isUnk := m.pieces[b.id].Type == Unknown
		switch {
		case isUnk && m.trainer.ByteFallback:
			for j := int(b.start); j < end; j++ {
				ids = append(ids, m.byteIDs[norm[j]])
			}
		case isUnk && prevUnk:
			// a run of unknown characters is one unknown piece
		default:
			ids = append(ids, b.id)
		}
		prevUnk = isUnk
	}
	return ids
}

// EncodePieces returns the pieces of text as strings (the unknown piece as the text it covers,
// byte pieces as <0xNN>), for tests and diagnostics.
func (m *Model) EncodePieces(text string) []string {
	ids := m.Encode(text)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = m.pieces[id].Text
	}
	return out
}

// Decode returns the text of ids, as SentencePieceProcessor.decode(ids). An id outside the
// vocabulary is an error.
func (m *Model) Decode(ids []int32) (string, error) {
	for _, id := range ids {
		if id < 0 || int(id) >= len(m.pieces) {
			return "", fmt.Errorf("sentencepiece: id %d is outside the vocabulary of %d pieces", id, len(m.pieces))
		}
	}
	var text strings.Builder
	var bytesRun []byte
	flushBytes := func() {
		for len(bytesRun) > 0 {
			r, l := utf8.DecodeRune(bytesRun)
			if r == utf8.RuneError && l == 1 {
				text.WriteString("\uFFFD")
			} else {
				text.Write(bytesRun[:l])
			}
			bytesRun = bytesRun[l:]
		}
		bytesRun = bytesRun[:0]
	}
	spec := m.normSpec
	bosWS, bosWSSeen := true, false
	for _, id0 := range ids {
		piece := m.pieces[id0].Text
		id := m.ID(piece) // SentencePiece decodes ids through their pieces
		pc := &m.pieces[id]
		if pc.Type == Byte {
			v, _ := pieceToByte(piece)
			bytesRun = append(bytesRun, v)
			continue
		}
		flushBytes()
		if bosWSSeen || text.Len() > 0 {
			bosWS = false
		}
		var surface string
		bosWSSeen = false
		switch pc.Type {
		case Control:
		case Unknown:
			surface = m.trainer.UnkSurface
		default:
			if bosWS && (spec.AddDummyPrefix || spec.RemoveExtraWhitespaces) {
				var ok bool
				if piece, ok = strings.CutPrefix(piece, spaceSymbol); ok && !spec.RemoveExtraWhitespaces {
					bosWSSeen = true
				}
			}
			surface = strings.ReplaceAll(piece, spaceSymbol, " ")
		}
		text.WriteString(surface)
	}
	flushBytes()
	out := text.String()
	if m.denorm != nil {
		out = m.denorm.normalize(out)
	}
	return out, nil
}
