package whisper_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

// ggufShape has 64-wide heads, as every Whisper model does, so that a file without head counts
// gets the right ones.
var ggufShape = ggml.Shape{Name: "mini", State: 128, Head: 2, AudioLayer: 2, TextLayer: 2}

// bareGGUF writes f's model the way converters that state nothing write it: the architecture and
// the tensors, vectors as [n], no hyper-parameters, filters or vocabulary.
func bareGGUF(t *testing.T, f *ggml.File, path string) *gguf.Writer {
	t.Helper()
	w := gguf.NewWriter()
	w.SetString("general.architecture", "whisper")
	w.SetUint32("whisper.encoder.layer_count", 7) // what such a converter writes, wrongly; not read
	for _, tn := range f.Tensors {
		shape := vectorsFlat(tn.Ne)
		if err := w.AddTensor(tn.Name, tn.Type, shape, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	if path != "" {
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// ggufFixture opens a random-weight model of ggufShape with matrices of type dt (closed at the
// end of the test), a pure-Go backend, and the model's tokens in GPT-2's byte-level alphabet.
func ggufFixture(t *testing.T, dt tensor.DType) (*ggml.File, backend.Backend, []string) {
	t.Helper()
	gf, err := ggml.Open(synthModelType(t, ggufShape, "tiny.en", dt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gf.Close() })
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	toks := make([]string, len(gf.Vocab))
	for i, b := range gf.Vocab {
		toks[i] = tokenizer.ByteLevel(b)
	}
	return gf, be, toks
}

// vectorsFlat returns a ggml shape as a GGUF one, with [1, n] vectors as [n].
func vectorsFlat(ne []int) []int64 {
	shape := make([]int64, 0, len(ne))
	for _, d := range ne {
		shape = append(shape, int64(d))
	}
	if len(shape) == 2 && shape[0] == 1 {
		shape = shape[1:]
	}
	return shape
}

// hfGGUF writes f's model under Hugging Face's parameter names, as candle's GGUF files have them:
// "model." first, layers, self_attn, q_proj ..., fc1/fc2, the layer norms by their role, and
// proj_out.weight, a copy of the token embedding. Vectors are [n]; nothing else is stated.
func hfGGUF(t *testing.T, f *ggml.File, path string) {
	t.Helper()
	w := gguf.NewWriter()
	w.SetString("general.architecture", "whisper")
	rename := strings.NewReplacer(
		"encoder.positional_embedding", "encoder.embed_positions.weight",
		"decoder.positional_embedding", "decoder.embed_positions.weight",
		"encoder.ln_post.", "encoder.layer_norm.", "decoder.ln.", "decoder.layer_norm.",
		"decoder.token_embedding.", "decoder.embed_tokens.",
		".blocks.", ".layers.", ".cross_attn_ln.", ".encoder_attn_layer_norm.", ".attn_ln.", ".self_attn_layer_norm.",
		".mlp_ln.", ".final_layer_norm.", ".cross_attn.", ".encoder_attn.", ".attn.", ".self_attn.",
		".query.", ".q_proj.", ".key.", ".k_proj.", ".value.", ".v_proj.", ".out.", ".out_proj.",
		".mlp.0.", ".fc1.", ".mlp.2.", ".fc2.",
	)
	for _, tn := range f.Tensors {
		shape := vectorsFlat(tn.Ne)
		if err := w.AddTensor("model."+rename.Replace(tn.Name), tn.Type, shape, tn.Data); err != nil {
			t.Fatal(err)
		}
		if tn.Name == "decoder.token_embedding.weight" {
			if err := w.AddTensor("proj_out.weight", tn.Type, shape, tn.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// hfTokenizer returns a Hugging Face tokenizer.json for vocab, with the special tokens after the
// text tokens as such files have them. The shared files store U+FFFD for the bytes of some tokens,
// so several ids share a text; a tokenizer.json cannot say that, and has only the first of them.
func hfTokenizer(t *testing.T, vocab [][]byte) []byte {
	t.Helper()
	ids := map[string]int{}
	for i, b := range vocab {
		if _, dup := ids[tokenizer.ByteLevel(b)]; len(b) > 0 && !dup {
			ids[tokenizer.ByteLevel(b)] = i
		}
	}
	ids["<|startoftranscript|>"] = 50257
	ids["<|en|>"] = 50258
	b, err := json.Marshal(map[string]any{
		"version": "1.0",
		"model":   map[string]any{"type": "BPE", "vocab": ids, "merges": []string{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGGUFSameModel: a model converted to GGUF (everything stated), and the same tensors in a
// bare GGUF with a tokenizer.json beside it (everything derived), load as the ggml file does and
// transcribe to the same tokens with the same probabilities, bit for bit.
func TestGGUFSameModel(t *testing.T) {
	src := synthModel(t, ggufShape, "tiny.en")
	dir := t.TempDir()
	gf, err := ggml.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	conv, err := whisper.ConvertGGML(gf, "mini")
	if err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(dir, "full", "mini.gguf")
	bare := filepath.Join(dir, "bare", "mini.gguf")
	hf := filepath.Join(dir, "hf", "mini.gguf")
	for _, d := range []string{filepath.Dir(full), filepath.Dir(bare), filepath.Dir(hf)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := conv.WriteFile(full); err != nil {
		t.Fatal(err)
	}
	bareGGUF(t, gf, bare)
	hfGGUF(t, gf, hf)
	var vocabJSON struct {
		Model struct{ Vocab map[string]int }
	}
	if err := json.Unmarshal(hfTokenizer(t, gf.Vocab), &vocabJSON); err != nil {
		t.Fatal(err)
	}
	if b, err := json.Marshal(vocabJSON.Model.Vocab); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(filepath.Dir(hf), "vocab.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(bare), "tokenizer.json"), hfTokenizer(t, gf.Vocab), 0o644); err != nil {
		t.Fatal(err)
	}
	gf.Close()

	for _, p := range []string{src, full, bare, hf} {
		ok, err := whisper.IsModelFile(p)
		if err != nil || !ok {
			t.Errorf("IsModelFile(%s) = %v, %v", filepath.Base(p), ok, err)
		}
	}

	be, _, err := backend.New("cpu", backend.Options{Threads: 2})
	if err != nil {
		be, _, err = backend.New("go", backend.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
	}
	defer be.Close()
	samples := whisper.LoadWAV(t, "jfk")
	p := asr.DefaultParams()
	p.TemperatureInc = 0
	type run struct {
		m   *whisper.Model
		res *asr.Result
	}
	var runs []run
	for _, path := range []string{src, full, bare, hf} {
		m, err := whisper.Open(be, path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer m.Close()
		// The scheduler transcribes: the same tokens with the same probabilities are the same
		// model.
		eng, err := asr.NewWhisper(m, asr.Config{MaxActive: 1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := eng.Transcribe(context.Background(), samples, p, nil)
		eng.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		runs = append(runs, run{m, res})
	}
	want := runs[0]
	for i, r := range runs[1:] {
		name := []string{"converted", "bare", "hugging face names"}[i]
		if r.m.HParams != want.m.HParams {
			t.Errorf("%s: hyper-parameters %+v, want %+v", name, r.m.HParams, want.m.HParams)
		}
		if !slices.Equal(r.m.Filters, want.m.Filters) {
			t.Errorf("%s: the mel filter bank differs", name)
		}
		if len(r.m.Tokens) != len(want.m.Tokens) {
			t.Fatalf("%s: %d tokens, want %d", name, len(r.m.Tokens), len(want.m.Tokens))
		}
		first := map[string]int{}
		differ := 0
		for id, b := range want.m.Tokens {
			if _, seen := first[string(b)]; !seen {
				first[string(b)] = id
			}
			if string(r.m.Tokens[id]) != string(b) {
				differ++
				if name == "converted" || first[string(b)] == id {
					t.Fatalf("%s: token %d is %q, want %q", name, id, r.m.Tokens[id], b)
				}
			}
		}
		if name != "converted" && differ == 0 {
			t.Error("bare: no token text is shared by several ids, so the tokenizer.json case went unchecked")
		}
		var got, exp []asr.Token
		for _, s := range r.res.Segments {
			got = append(got, s.Tokens...)
		}
		for _, s := range want.res.Segments {
			exp = append(exp, s.Tokens...)
		}
		same := func(a, b asr.Token) bool {
			return a.ID == b.ID && a.P == b.P && a.PLog == b.PLog && a.T0 == b.T0 && a.T1 == b.T1 &&
				(name != "converted" || a.Text == b.Text)
		}
		if len(exp) == 0 || !slices.EqualFunc(got, exp, same) || (name == "converted" && r.res.Text != want.res.Text) {
			t.Errorf("%s: transcribed %d tokens %q, the ggml file %d tokens %q", name, len(got), r.res.Text, len(exp), want.res.Text)
		}
	}
}

// TestGGUFErrors: files that are not a Whisper model the way they say, or that contradict
// themselves, are refused with an error that names the problem.
func TestGGUFErrors(t *testing.T) {
	gf, be, toks := ggufFixture(t, tensor.F16)
	withTokens := func(w *gguf.Writer) { w.SetStrings("tokenizer.ggml.tokens", toks) }
	for _, c := range []struct {
		name  string
		edit  func(w *gguf.Writer)
		vocab [][]byte
		want  string
	}{
		{"not whisper", func(w *gguf.Writer) { w.SetString("general.architecture", "llama"); withTokens(w) }, nil, `architecture is "llama"`},
		{"no vocabulary", func(*gguf.Writer) {}, nil, "no vocabulary"},
		{"layer count disagrees", func(w *gguf.Writer) { w.SetUint32("whisper.decoder.block_count", 3); withTokens(w) }, nil, "whisper.decoder.block_count = 3"},
		{"mel count disagrees", func(w *gguf.Writer) { w.SetUint32("whisper.encoder.mel_count", 128); withTokens(w) }, nil, "mel_count"},
		{"stated as a string", func(w *gguf.Writer) { w.SetString("whisper.vocab_size", "51864"); withTokens(w) }, nil, "whisper.vocab_size"},
		{"zero heads", func(w *gguf.Writer) { w.SetUint32("whisper.encoder.attention.head_count", 0); withTokens(w) }, nil, "out of range"},
		{"heads stated as a string", func(w *gguf.Writer) { w.SetString("whisper.encoder.attention.head_count", "2"); withTokens(w) }, nil, "whisper.encoder.attention.head_count"},
		{"heads not dividing", func(w *gguf.Writer) { w.SetUint32("whisper.decoder.attention.head_count", 3); withTokens(w) }, nil, "multiples of the head counts"},
		{"token outside the alphabet", func(w *gguf.Writer) {
			bad := slices.Clone(toks)
			bad[17] = "中"
			w.SetStrings("tokenizer.ggml.tokens", bad)
		}, nil, "token 17"},
		{"wrong tokenizer model", func(w *gguf.Writer) { w.SetString("tokenizer.ggml.model", "llama"); withTokens(w) }, nil, "tokenizer.ggml.model"},
		{"bad filter bank", func(w *gguf.Writer) {
			withTokens(w)
			if err := w.AddTensor("mel_filters", tensor.F32, []int64{200, 80}, make([]byte, 4*200*80)); err != nil {
				t.Fatal(err)
			}
		}, nil, "mel_filters"},
		{"unexpected tensor", func(w *gguf.Writer) {
			withTokens(w)
			if err := w.AddTensor("proj_out.weight", tensor.F32, []int64{4}, make([]byte, 16)); err != nil {
				t.Fatal(err)
			}
		}, nil, `unexpected tensor "proj_out.weight"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := bareGGUF(t, gf, "")
			c.edit(w)
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, err := whisper.LoadGGUF(be, f, c.vocab)
			if err == nil {
				m.Close()
				t.Fatalf("loaded; want an error mentioning %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}

	// A missing tensor is named.
	w := gguf.NewWriter()
	w.SetString("general.architecture", "whisper")
	for _, tn := range gf.Tensors {
		if tn.Name == "decoder.blocks.1.mlp_ln.bias" {
			continue
		}
		shape := make([]int64, len(tn.Ne))
		for i, d := range tn.Ne {
			shape[i] = int64(d)
		}
		if err := w.AddTensor(tn.Name, tn.Type, shape, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	w.SetStrings("tokenizer.ggml.tokens", toks)
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if _, err := whisper.Open(be, path); err == nil || !strings.Contains(err.Error(), `"decoder.blocks.1.mlp_ln.bias" is missing`) {
		t.Errorf("missing tensor: %v", err)
	}

	// Open looks for the vocabulary beside the file and says where it looked.
	bareGGUF(t, gf, path)
	if _, err := whisper.Open(be, path); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("no tokenizer beside the file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model": {"type": "BPE", "vocab": [1, 2]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := whisper.Open(be, path); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer.json")) {
		t.Errorf("malformed tokenizer.json: %v", err)
	}

	// A GGUF of another architecture without tokens is refused for its architecture, not its
	// vocabulary.
	w = gguf.NewWriter()
	w.SetString("general.architecture", "llama")
	if err := w.AddTensor("x", tensor.F32, []int64{4}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other.gguf")
	if err := w.WriteFile(other); err != nil {
		t.Fatal(err)
	}
	if _, err := whisper.Open(be, other); err == nil || !strings.Contains(err.Error(), `architecture is "llama"`) {
		t.Errorf("another architecture without tokens: %v", err)
	}

	// A language model's GGUF is not a Whisper model.
	lm, err := llama.Synth(llama.Shapes["15M"], tensor.Q8_0, 1)
	if err != nil {
		t.Fatal(err)
	}
	lpath := filepath.Join(dir, "lm.gguf")
	if err := lm.WriteFile(lpath); err != nil {
		t.Fatal(err)
	}
	if ok, err := whisper.IsModelFile(lpath); ok || err != nil {
		t.Errorf("IsModelFile(llama GGUF) = %v, %v", ok, err)
	}
	if _, err := whisper.Open(be, lpath); err == nil || !strings.Contains(err.Error(), "architecture") {
		t.Errorf("opening a llama GGUF as Whisper: %v", err)
	}
}

func TestParseTokenizerJSON(t *testing.T) {
	flat := `{"!": 0, "Ġthe": 2, "<|endoftext|>": 50256, "<|startoftranscript|>": 50257}`
	v, err := whisper.ParseTokenizerJSON([]byte(flat))
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 50257 || string(v[0]) != "!" || len(v[1]) != 0 || string(v[2]) != " the" || string(v[50256]) != "<|endoftext|>" {
		t.Errorf("vocab.json: %d tokens, %q %q %q", len(v), v[0], v[1], v[2])
	}
	if v, err := whisper.ParseTokenizerJSON([]byte(`{"a": 0, "model": 1}`)); err != nil || len(v) != 2 || string(v[1]) != "model" {
		t.Errorf("vocab.json with the token \"model\": %q, %v", v, err)
	}
	full := `{"added_tokens": [], "model": {"type": "BPE", "vocab": {"a": 0, "Ċ": 1}}}`
	if v, err := whisper.ParseTokenizerJSON([]byte(full)); err != nil || len(v) != 2 || string(v[1]) != "\n" {
		t.Errorf("tokenizer.json: %q, %v", v, err)
	}
	for _, bad := range []string{
		`[`, `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, `{"a": -1}`, `{"a": 0, "b": 0}`,
		`{"中": 0}`, `{}`, `{"a": "0"}`,
	} {
		if _, err := whisper.ParseTokenizerJSON([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestGGUFVectorShapes: a vector (bias, norm weight) is taken as [n], [1, n] or [n, 1], and any
// other split of its n elements is refused; a matrix must have its own row length.
func TestGGUFVectorShapes(t *testing.T) {
	gf, be, toks := ggufFixture(t, tensor.F16)
	S := int64(ggufShape.State)
	for _, c := range []struct {
		name  string
		shape []int64
		ok    bool
	}{
		{"encoder.conv1.bias", []int64{S}, true},
		{"encoder.conv1.bias", []int64{1, S}, true},
		{"encoder.conv1.bias", []int64{S, 1}, true},
		{"encoder.conv1.bias", []int64{2, S / 2}, false},
		{"encoder.conv1.bias", []int64{S / 2, 2}, false},
		{"decoder.ln.weight", []int64{S}, true},
		{"decoder.ln.weight", []int64{1, S}, true},
		{"decoder.ln.weight", []int64{S, 1}, true},
		{"decoder.ln.weight", []int64{2, S / 2}, false},
		{"decoder.ln.weight", []int64{S / 2, 2}, false},
		{"decoder.blocks.0.mlp.0.weight", []int64{S, 4 * S}, true},
		{"decoder.blocks.0.mlp.0.weight", []int64{4 * S, S}, false},
		{"encoder.conv2.weight", []int64{S, 3, S}, false},
	} {
		w := gguf.NewWriter()
		w.SetString("general.architecture", "whisper")
		w.SetStrings("tokenizer.ggml.tokens", toks)
		for _, tn := range gf.Tensors {
			shape := make([]int64, 0, len(tn.Ne))
			for _, d := range tn.Ne {
				shape = append(shape, int64(d))
			}
			if tn.Name == c.name {
				shape = c.shape
			}
			if err := w.AddTensor(tn.Name, tn.Type, shape, tn.Data); err != nil {
				t.Fatal(err)
			}
		}
		f := modeltest.Parse(t, w)
		m, err := whisper.LoadGGUF(be, f, nil)
		if m != nil {
			m.Close()
		}
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), c.name)) {
			t.Errorf("%s as %v: %v, want accepted %v", c.name, c.shape, err, c.ok)
		}
	}
}

// TestGGUFQuantizedHParams: a quantised model's header reads the same from GGUF as from the
// ggml file, the quantisation version folded into FType as whisper.cpp's header folds it.
func TestGGUFQuantizedHParams(t *testing.T) {
	gf, be, _ := ggufFixture(t, tensor.Q8_0)
	want, err := whisper.Load(be, gf)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if want.FType < 1000 {
		t.Fatalf("the ggml file's ftype %d has no quantisation version", want.FType)
	}
	w, err := whisper.ConvertGGML(gf, "q8")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"converted", "bare"} {
		if name == "bare" {
			w = bareGGUF(t, gf, "")
			w.SetStrings("tokenizer.ggml.tokens", []string{"a"})
		}
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		m, err := whisper.LoadGGUF(be, f, nil)
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
		if m.HParams != want.HParams {
			t.Errorf("%s: %+v, the ggml file %+v", name, m.HParams, want.HParams)
		}
		m.Close()
	}
}

// TestQuantizeGGML: the matrices whisper.cpp's quantize tool quantises (every two-dimensional
// tensor but the convolutions' biases and the positional embeddings) become dt, each weight
// within its block's quantisation step of the original; the rest keep their bytes; the header
// says so; and the model loads and encodes within Q8_0's error of the F16 model.
func TestQuantizeGGML(t *testing.T) {
	gf, be, _ := ggufFixture(t, tensor.F16)
	hp, ts, err := whisper.QuantizeGGML(gf, tensor.Q8_0)
	if err != nil {
		t.Fatal(err)
	}
	if hp.FType != 2007 { // GGML_FTYPE_MOSTLY_Q8_0 + 1000 × GGML_QNT_VERSION
		t.Errorf("ftype %d, want 2007", hp.FType)
	}
	skip := map[string]bool{"encoder.conv1.bias": true, "encoder.conv2.bias": true,
		"encoder.positional_embedding": true, "decoder.positional_embedding": true}
	quantised := 0
	for i, tn := range ts {
		src := gf.Tensors[i]
		if len(src.Ne) != 2 || skip[src.Name] {
			if tn.Type != src.Type || &tn.Data[0] != &src.Data[0] {
				t.Errorf("%s: %v, changed", src.Name, tn.Type)
			}
			continue
		}
		quantised++
		if tn.Type != tensor.Q8_0 {
			t.Fatalf("%s: %v, want Q8_0", src.Name, tn.Type)
		}
		n := src.Ne[0]
		want, got := make([]float32, n), make([]float32, n)
		sr, _ := src.Type.RowSize(int64(n))
		qr, _ := tensor.Q8_0.RowSize(int64(n))
		for r := range int(src.Rows()) {
			if err := quant.Dequantize(src.Type, src.Data[r*int(sr):(r+1)*int(sr)], want); err != nil {
				t.Fatal(err)
			}
			if err := quant.Dequantize(tensor.Q8_0, tn.Data[r*int(qr):(r+1)*int(qr)], got); err != nil {
				t.Fatal(err)
			}
			for b := 0; b < n; b += 32 {
				amax := 0.0
				for _, v := range want[b : b+32] {
					amax = max(amax, math.Abs(float64(v)))
				}
				for k := b; k < b+32; k++ { // half a step (amax/127), plus the F16 scale's rounding
					if d := math.Abs(float64(got[k] - want[k])); d > amax/127*0.51+amax*1e-3 {
						t.Fatalf("%s row %d element %d: %v, was %v (block max %v)", src.Name, r, k, got[k], want[k], amax)
					}
				}
			}
		}
	}
	if quantised != 6*ggufShape.AudioLayer+10*ggufShape.TextLayer+1 { // the convolutions' weights are 3-D
		t.Errorf("%d tensors quantised", quantised)
	}
	if _, _, err := whisper.QuantizeGGML(gf, tensor.Q4_K); err == nil {
		t.Error("Q4_K, which whisper.cpp does not load: no error")
	}
	// whisper.cpp's loader takes the convolutions' weights in F32 in an F32 file and in F16 in any
	// other: an F32 file's must follow its matrices.
	if _, ts32, err := whisper.QuantizeGGML(gf, tensor.F32); err != nil {
		t.Fatal(err)
	} else {
		for _, tn := range ts32 {
			if len(tn.Ne) == 3 && tn.Type != tensor.F32 {
				t.Errorf("F32: %s is %v", tn.Name, tn.Type)
			}
		}
	}

	path := filepath.Join(t.TempDir(), "q8.bin")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ggml.Write(out, hp, gf.Filters, gf.Vocab, ts); err != nil {
		t.Fatal(err)
	}
	out.Close()
	encode := func(m *whisper.Model) []float32 {
		enc, cross := newEncoder(t, m)
		defer enc.Close()
		defer cross.Close()
		mel := make([]float32, m.Mels*whisper.WindowFrames)
		for i := range mel {
			mel[i] = float32((i*7919)%1000)/1000 - 0.5
		}
		o := make([]float32, m.AudioCtx*m.AudioState)
		if err := enc.Encode(mel, cross, o); err != nil {
			t.Fatal(err)
		}
		return o
	}
	ref, err := whisper.Load(be, gf)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	want := encode(ref)
	q, err := whisper.Open(be, path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if d := relRMS(encode(q), want); d > 0.035 || math.IsNaN(d) { // TestQuantizedModels' Q8_0 bound
		t.Errorf("Q8_0 encoder output: relative rms error %.3g against F16", d)
	}
}
