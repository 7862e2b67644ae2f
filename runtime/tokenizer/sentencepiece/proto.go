package sentencepiece

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// The parts of sentencepiece_model.proto (ModelProto) that encoding and decoding read, by field
// number. Other fields are skipped as protobuf allows; a field read here with the wrong wire type,
// and any malformed wire data, is an error.

// PieceType is a piece's type (ModelProto.SentencePiece.Type).
type PieceType int32

// Piece types.
const (
	Normal      PieceType = 1 // an ordinary piece, chosen by score
	Unknown     PieceType = 2 // the unknown piece (exactly one)
	Control     PieceType = 3 // <s>, </s>: never produced by encoding, decoded as nothing
	UserDefined PieceType = 4 // always taken whole where it occurs, never normalised
	Unused      PieceType = 5 // in the vocabulary but never produced
	Byte        PieceType = 6 // <0xNN>: byte fallback
)

func (t PieceType) String() string {
	switch t {
	case Normal:
		return "normal"
	case Unknown:
		return "unknown"
	case Control:
		return "control"
	case UserDefined:
		return "user-defined"
	case Unused:
		return "unused"
	case Byte:
		return "byte"
	}
	return fmt.Sprintf("type(%d)", int32(t))
}

// ModelType is TrainerSpec.model_type.
type ModelType int32

// Model types.
const (
	Unigram ModelType = 1
	BPE     ModelType = 2
	Word    ModelType = 3
	Char    ModelType = 4
)

func (t ModelType) String() string {
	switch t {
	case Unigram:
		return "unigram"
	case BPE:
		return "bpe"
	case Word:
		return "word"
	case Char:
		return "char"
	}
	return fmt.Sprintf("model_type(%d)", int32(t))
}

// Piece is one vocabulary entry.
type Piece struct {
	Text  string
	Score float32
	Type  PieceType
}

// TrainerSpec holds the trainer settings that matter after training.
type TrainerSpec struct {
	ModelType               ModelType
	VocabSize               int32
	ByteFallback            bool
	TreatWhitespaceAsSuffix bool
	UnkSurface              string // what decoding writes for the unknown piece
}

// NormalizerSpec is ModelProto.normalizer_spec (or denormalizer_spec).
type NormalizerSpec struct {
	Name                   string // "nmt_nfkc", "identity", ...: informative; the charsmap is what runs
	PrecompiledCharsmap    []byte
	AddDummyPrefix         bool
	RemoveExtraWhitespaces bool
	EscapeWhitespaces      bool
	NormalizationRuleTSV   string
}

// modelProto is a parsed ModelProto.
type modelProto struct {
	pieces        []Piece
	trainer       TrainerSpec
	normalizer    NormalizerSpec
	denormalizer  NormalizerSpec
	hasDenormSpec bool
}

// defaultUnkSurface is SentencePiece's kDefaultUnknownSymbol (" ⁇ ").
const defaultUnkSurface = " \u2047 "

func defaultNormalizerSpec() NormalizerSpec {
	return NormalizerSpec{AddDummyPrefix: true, RemoveExtraWhitespaces: true, EscapeWhitespaces: true}
}

// wireErr is a malformed-protobuf error.
func wireErr(what string, n int) error {
	if n < 0 {
		return fmt.Errorf("%s: %w", what, protowire.ParseError(n))
	}
	return errors.New(what)
}

// fields walks the fields of one message, calling f with each field's number, wire type and
// the bytes after its tag; f returns how many bytes the value took (negative: a protowire error
// code) or an error. Unknown fields are passed to skip.
func fields(b []byte, what string, f func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return wireErr(what+": bad tag", n)
		}
		b = b[n:]
		m, err := f(num, typ, b)
		if err != nil {
			return fmt.Errorf("%s: field %d: %w", what, num, err)
		}
		if m == 0 { // not a field f reads: skip it
			m = protowire.ConsumeFieldValue(num, typ, b)
		}
		if m < 0 {
			return wireErr(fmt.Sprintf("%s: field %d", what, num), m)
		}
		b = b[m:]
	}
	return nil
}

func wantType(typ, want protowire.Type) error {
	if typ != want {
		return fmt.Errorf("wire type %d, want %d", typ, want)
	}
	return nil
}

func bytesField(typ protowire.Type, b []byte) ([]byte, int, error) {
	if err := wantType(typ, protowire.BytesType); err != nil {
		return nil, 0, err
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, 0, protowire.ParseError(n)
	}
	return v, n, nil
}

func varintField(typ protowire.Type, b []byte) (uint64, int, error) {
	if err := wantType(typ, protowire.VarintType); err != nil {
		return 0, 0, err
	}
	v, n := protowire.ConsumeVarint(b)
	if n < 0 {
		return 0, 0, protowire.ParseError(n)
	}
	return v, n, nil
}

// int32Field reads an int32 or enum varint (negative values are sign-extended to 64 bits on the
// wire).
func int32Field(typ protowire.Type, b []byte) (int32, int, error) {
	v, n, err := varintField(typ, b)
	if err != nil {
		return 0, 0, err
	}
	if int64(v) < math.MinInt32 || int64(v) > math.MaxInt32 {
		return 0, 0, fmt.Errorf("value %d is out of the int32 range", int64(v))
	}
	return int32(int64(v)), n, nil
}

func boolField(typ protowire.Type, b []byte) (bool, int, error) {
	v, n, err := varintField(typ, b)
	return v != 0, n, err
}

func parseModelProto(b []byte) (*modelProto, error) {
	m := &modelProto{
		trainer:      TrainerSpec{ModelType: Unigram, UnkSurface: defaultUnkSurface},
		normalizer:   defaultNormalizerSpec(),
		denormalizer: defaultNormalizerSpec(),
	}
	err := fields(b, "ModelProto", func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch num {
		case 1, 2, 3, 5:
			v, n, err := bytesField(typ, b)
			if err != nil {
				return 0, err
			}
			switch num {
			case 1:
				p, err := parsePiece(v, len(m.pieces))
				if err != nil {
					return 0, err
				}
				m.pieces = append(m.pieces, p)
			case 2:
				err = parseTrainerSpec(v, &m.trainer)
			case 3:
				err = parseNormalizerSpec(v, &m.normalizer, "normalizer_spec")
			case 5:
				m.hasDenormSpec = true
				err = parseNormalizerSpec(v, &m.denormalizer, "denormalizer_spec")
			}
			return n, err
		}
		return 0, nil
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

func parsePiece(b []byte, i int) (Piece, error) {
	p := Piece{Type: Normal}
	err := fields(b, fmt.Sprintf("piece %d", i), func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch num {
		case 1:
			v, n, err := bytesField(typ, b)
			p.Text = string(v)
			return n, err
		case 2:
			if err := wantType(typ, protowire.Fixed32Type); err != nil {
				return 0, err
			}
			v, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			p.Score = math.Float32frombits(v)
			return n, nil
		case 3:
			v, n, err := int32Field(typ, b)
			if err != nil {
				return 0, err
			}
			if v < int32(Normal) || v > int32(Byte) {
				return 0, fmt.Errorf("unknown piece type %d", v)
			}
			p.Type = PieceType(v)
			return n, nil
		}
		return 0, nil
	})
	return p, err
}

func parseTrainerSpec(b []byte, t *TrainerSpec) error {
	return fields(b, "trainer_spec", func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch num {
		case 3:
			v, n, err := int32Field(typ, b)
			t.ModelType = ModelType(v)
			return n, err
		case 4:
			v, n, err := int32Field(typ, b)
			t.VocabSize = v
			return n, err
		case 24:
			v, n, err := boolField(typ, b)
			t.TreatWhitespaceAsSuffix = v
			return n, err
		case 35:
			v, n, err := boolField(typ, b)
			t.ByteFallback = v
			return n, err
		case 44:
			v, n, err := bytesField(typ, b)
			t.UnkSurface = string(v)
			return n, err
		}
		return 0, nil
	})
}

func parseNormalizerSpec(b []byte, s *NormalizerSpec, what string) error {
	return fields(b, what, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch num {
		case 1:
			v, n, err := bytesField(typ, b)
			s.Name = string(v)
			return n, err
		case 2:
			v, n, err := bytesField(typ, b)
			s.PrecompiledCharsmap = v
			return n, err
		case 3:
			v, n, err := boolField(typ, b)
			s.AddDummyPrefix = v
			return n, err
		case 4:
			v, n, err := boolField(typ, b)
			s.RemoveExtraWhitespaces = v
			return n, err
		case 5:
			v, n, err := boolField(typ, b)
			s.EscapeWhitespaces = v
			return n, err
		case 6:
			v, n, err := bytesField(typ, b)
			s.NormalizationRuleTSV = string(v)
			return n, err
		}
		return 0, nil
	})
}
