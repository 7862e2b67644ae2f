package sentencepiece

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// standInPath is the stand-in tokenizer of the Pocket TTS references: a unigram model of 4000
// pieces with byte fallback, dummy prefix, nmt_nfkc and whitespace kept.
const standInPath = "reference/tts/tokenizer/random-unigram-4000.model"

var standIn struct {
	once sync.Once
	m    *Model
	err  error
}

// loadStandIn loads the stand-in model, skipping t when ../shared is absent.
func loadStandIn(t testing.TB) *Model {
	t.Helper()
	p := sharedtest.Path(t, standInPath)
	standIn.once.Do(func() { standIn.m, standIn.err = Load(p) })
	if standIn.err != nil {
		t.Fatal(standIn.err)
	}
	return standIn.m
}

// synthPiece is one piece of a model built in a test.
type synthPiece struct {
	text  string
	score float32
	typ   PieceType
}

// synthModel serialises a ModelProto by field number.
type synthModel struct {
	pieces       []synthPiece
	modelType    ModelType
	byteFallback bool
	normName     string
	charsmap     []byte
	dummyPrefix  bool
	removeExtra  bool
	escape       bool
	asSuffix     bool
	denormMap    []byte
}

func (s synthModel) bytes() []byte {
	var b []byte
	for _, p := range s.pieces {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, p.text)
		m = protowire.AppendTag(m, 2, protowire.Fixed32Type)
		m = protowire.AppendFixed32(m, math.Float32bits(p.score))
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, uint64(p.typ))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	var tr []byte
	mt := s.modelType
	if mt == 0 {
		mt = Unigram
	}
	tr = protowire.AppendTag(tr, 3, protowire.VarintType)
	tr = protowire.AppendVarint(tr, uint64(mt))
	tr = protowire.AppendTag(tr, 4, protowire.VarintType)
	tr = protowire.AppendVarint(tr, uint64(len(s.pieces)))
	tr = protowire.AppendTag(tr, 35, protowire.VarintType)
	tr = protowire.AppendVarint(tr, protowire.EncodeBool(s.byteFallback))
	tr = protowire.AppendTag(tr, 24, protowire.VarintType)
	tr = protowire.AppendVarint(tr, protowire.EncodeBool(s.asSuffix))
	tr = protowire.AppendTag(tr, 999, protowire.BytesType) // an unknown field, skipped
	tr = protowire.AppendString(tr, "ignored")
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, tr)
	norm := func(name string, cm []byte, dummy, remove, escape bool) []byte {
		var n []byte
		n = protowire.AppendTag(n, 1, protowire.BytesType)
		n = protowire.AppendString(n, name)
		if len(cm) > 0 {
			n = protowire.AppendTag(n, 2, protowire.BytesType)
			n = protowire.AppendBytes(n, cm)
		}
		for i, v := range []bool{dummy, remove, escape} {
			n = protowire.AppendTag(n, protowire.Number(3+i), protowire.VarintType)
			n = protowire.AppendVarint(n, protowire.EncodeBool(v))
		}
		return n
	}
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, norm(s.normName, s.charsmap, s.dummyPrefix, s.removeExtra, s.escape))
	if s.denormMap != nil {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, norm("denorm", s.denormMap, false, false, false))
	}
	return b
}

// basePieces returns <unk>, <s>, </s>, the 256 byte pieces when withBytes, then words.
func basePieces(withBytes bool, words ...synthPiece) []synthPiece {
	p := []synthPiece{{"<unk>", 0, Unknown}, {"<s>", 0, Control}, {"</s>", 0, Control}}
	if withBytes {
		for b := range 256 {
			p = append(p, synthPiece{byteToPiece(byte(b)), 0, Byte})
		}
	}
	return append(p, words...)
}

// python returns a python3 that imports sentencepiece, or skips t.
func python(t testing.TB) string {
	t.Helper()
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import sentencepiece").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with the sentencepiece module: install it (apt-get install python3-sentencepiece) to compare with SentencePiece itself")
	return ""
}

// spmScript encodes the texts and decodes the id lists it is given with SentencePiece.
const spmScript = `
import json, sys
import sentencepiece as spm
req = json.load(open(sys.argv[1], encoding="utf-8"))
sp = spm.SentencePieceProcessor(model_file=req["model"])
out = {"version": spm.__version__,
       "ids": sp.encode(req["texts"]),
       "decoded": [sp.decode(ids) for ids in req["decode"]]}
json.dump(out, open(sys.argv[2], "w", encoding="utf-8"))
`

type spmResult struct {
	Version string    `json:"version"`
	IDs     [][]int32 `json:"ids"`
	Decoded []string  `json:"decoded"`
}

// runSPM runs SentencePiece (through python3) over texts and id lists with the model file.
func runSPM(t testing.TB, py, model string, texts []string, decode [][]int32) spmResult {
	t.Helper()
	dir := t.TempDir()
	req, err := json.Marshal(map[string]any{"model": model, "texts": texts, "decode": decode})
	if err != nil {
		t.Fatal(err)
	}
	in, out, script := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json"), filepath.Join(dir, "spm.py")
	if err := os.WriteFile(in, req, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte(spmScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(py, script, in, out).CombinedOutput(); err != nil {
		t.Fatalf("SentencePiece: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res spmResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.IDs) != len(texts) || len(res.Decoded) != len(decode) {
		t.Fatalf("SentencePiece answered %d/%d of %d/%d", len(res.IDs), len(res.Decoded), len(texts), len(decode))
	}
	return res
}
