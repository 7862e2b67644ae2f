package pockettts

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/safetensors"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

// refTensor is one entry of reference/tts/weights.json.
type refTensor struct {
	Name   string `json:"name"`
	Shape  []int  `json:"shape"`
	DType  string `json:"dtype"`
	SHA256 string `json:"sha256"` // first 16 hex digits of the sha256 of the tensor's bytes
}

func readWeightsJSON(t testing.TB) []refTensor {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "reference/tts/weights.json"))
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		Tensors []refTensor `json:"tensors"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	return w.Tensors
}

// TestLayoutIsUpstreams: the english configuration's layout is the reference checkpoint's tensor
// list, in order (214 tensors).
func TestLayoutIsUpstreams(t *testing.T) {
	ref := readWeightsJSON(t)
	cfg := English()
	layout := cfg.Layout()
	if len(layout) != len(ref) {
		t.Errorf("%d tensors in the layout, %d in weights.json", len(layout), len(ref))
	}
	for i := range min(len(layout), len(ref)) {
		if layout[i].Name != ref[i].Name || !slices.Equal(layout[i].Shape, ref[i].Shape) {
			t.Errorf("tensor %d: %s %v, weights.json has %s %v", i, layout[i].Name, layout[i].Shape, ref[i].Name, ref[i].Shape)
		}
	}
	if cfg.FrameSamples() != 1920 || cfg.FrameRate() != 12.5 || cfg.HeadDim() != 64 {
		t.Errorf("frame %d samples at %v Hz, head %d", cfg.FrameSamples(), cfg.FrameRate(), cfg.HeadDim())
	}
}

// TestLoadRandomWeights loads the random-weight checkpoint of the references: the configuration
// read off its shapes is upstream's english one, and every bound tensor holds the bytes that
// weights.json's hash names.
func TestLoadRandomWeights(t *testing.T) {
	path := sharedtest.PocketTTSRandomWeights(t)
	ref := readWeightsJSON(t)
	ck, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w := ck.Weights
	if !reflect.DeepEqual(w.Config, English()) {
		t.Errorf("config %+v\nwant   %+v", w.Config, English())
	}
	byName := map[string]*Tensor{}
	for _, tt := range w.All() {
		if byName[tt.Name] != nil {
			t.Errorf("tensor %q bound twice", tt.Name)
		}
		byName[tt.Name] = tt
	}
	if len(byName) != len(ref) {
		t.Errorf("%d tensors bound, want %d", len(byName), len(ref))
	}
	for _, r := range ref {
		tt := byName[r.Name]
		if tt == nil {
			t.Errorf("tensor %q not bound", r.Name)
			continue
		}
		sum := sha256.Sum256(tt.Data)
		if got := hex.EncodeToString(sum[:8]); got != r.SHA256 || tt.DType != tensor.F32 {
			t.Errorf("tensor %q: %v, sha256 %s…, weights.json has %s…", r.Name, tt.DType, got, r.SHA256)
		}
	}
	// Spot checks of roles: the EOS bias is −6.35, the time embeddings' frequencies exp(−ln(1e4)·i/128).
	if b := w.OutEOS.B.Float32s(); b[0] != float32(-6.35) {
		t.Errorf("EOS bias %v", b)
	}
	fr := w.Flow.TimeEmbed[1].Freqs.Float32s()
	for i, f := range fr {
		want := math.Exp(-math.Log(10000) * float64(i) / 128)
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Fatalf("freqs[%d] = %v, want %v", i, f, want)
		}
	}
	if ck.Tokenizer != nil {
		t.Error("a tokenizer was found beside the checkpoint in the temporary directory")
	}
}

// TestReferenceVoice reads the reference voice state (42 positions) and writes it back.
func TestReferenceVoice(t *testing.T) {
	cfg := English()
	p := sharedtest.Path(t, "reference/tts/voice/voice_state.safetensors")
	v, err := LoadVoice(p, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if v.Positions != 42 || len(v.Layers) != 6 || len(v.Layers[5].V) != 42*16*64 || v.Bytes() != 42*48*1024 {
		t.Fatalf("voice: %d positions, %d layers, %d bytes", v.Positions, len(v.Layers), v.Bytes())
	}
	// The file's own bytes: layer 3's cache, values after keys.
	f, err := safetensors.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, _ := f.Tensor("transformer.layers.3.self_attn/cache")
	all, _ := f.Float32s(c)
	if !slices.Equal(all[:42*1024], v.Layers[3].K) || !slices.Equal(all[42*1024:], v.Layers[3].V) {
		t.Error("layer 3's keys or values are not the file's")
	}
	var buf bytes.Buffer
	if err := v.WriteSafetensors(&buf, &cfg); err != nil {
		t.Fatal(err)
	}
	g, err := safetensors.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	v2, err := ReadVoice(g, &cfg)
	if err != nil || !reflect.DeepEqual(v, v2) {
		t.Errorf("voice round trip: %v", err)
	}
}

// tinyConfig is a small configuration of every part, for tests that build checkpoints.
func tinyConfig() Config {
	return Config{
		Dim: 128, Heads: 2, Layers: 2, FFDim: 256, Vocab: 8, LatentDim: 4, RoPEBase: 10000,
		FlowDim: 16, FlowDepth: 2, FlowFreqs: 4,
		MimiDim: 64, MimiHeads: 1, MimiLayers: 1, MimiFFDim: 96, MimiContext: 250,
		Filters: 4, Ratios: []int{3, 2}, KernelSize: 5, LastKernelSize: 3, ResKernelSize: 3, Compress: 2,
		UpsampleStride: 4, SampleRate: 24000,
		Encoder: true, EncoderLatentDim: 4, BOSBeforeVoice: true,
	}
}

// buildCheckpoint writes a safetensors checkpoint of cfg's layout with random values; dtype
// picks the element type of each tensor by its index.
func buildCheckpoint(t testing.TB, cfg Config, dtype func(i int) safetensors.DType, edit func(w *safetensors.Writer)) []byte {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 4))
	w := safetensors.NewWriter()
	for i, s := range cfg.Layout() {
		n := 1
		shape := make([]int64, len(s.Shape))
		for j, d := range s.Shape {
			n *= d
			shape[j] = int64(d)
		}
		dt := dtype(i)
		b := make([]byte, n*dt.Size())
		for k := range n {
			x := float32(r.NormFloat64())
			switch dt {
			case safetensors.F32:
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(x))
			default: // BF16 and F16: any bit pattern of a finite value will do
				binary.LittleEndian.PutUint16(b[2*k:], uint16(math.Float32bits(x)>>16)&0x3bff)
			}
		}
		if err := w.Add(s.Name, dt, shape, b); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(w)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tinyTokenizer is a SentencePiece model of n pieces: <unk>, <s>, </s>, then single letters.
func tinyTokenizer(t testing.TB, n int) *sentencepiece.Model {
	t.Helper()
	var b []byte
	for i := range n {
		text, typ := string(rune('a'+i-3)), uint64(1)
		switch i {
		case 0:
			text, typ = "<unk>", 2
		case 1, 2:
			text, typ = []string{"", "<s>", "</s>"}[i], 3
		}
		var p []byte
		p = protowire.AppendTag(p, 1, protowire.BytesType)
		p = protowire.AppendString(p, text)
		p = protowire.AppendTag(p, 2, protowire.Fixed32Type)
		p = protowire.AppendFixed32(p, math.Float32bits(-float32(i)))
		p = protowire.AppendTag(p, 3, protowire.VarintType)
		p = protowire.AppendVarint(p, typ)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, p)
	}
	var ns []byte
	ns = protowire.AppendTag(ns, 1, protowire.BytesType)
	ns = protowire.AppendString(ns, "identity")
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, ns)
	m, err := sentencepiece.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tinyVoice(cfg Config, positions int) *Voice {
	r := rand.New(rand.NewPCG(5, 6))
	v := &Voice{Positions: positions}
	for range cfg.Layers {
		k := make([]float32, positions*cfg.Dim)
		val := make([]float32, positions*cfg.Dim)
		for i := range k {
			k[i], val[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		v.Layers = append(v.Layers, VoiceLayer{K: k, V: val})
	}
	return v
}

// TestGGUFRoundTrip: a checkpoint of mixed dtypes, read from safetensors, written as GGUF with a
// tokenizer, voices and text settings, reads back identical.
func TestGGUFRoundTrip(t *testing.T) {
	cfg := tinyConfig()
	dir := t.TempDir()
	mixed := func(i int) safetensors.DType {
		return []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16}[i%3]
	}
	stPath := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(stPath, buildCheckpoint(t, cfg, mixed, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := Open(stPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if !reflect.DeepEqual(src.Weights.Config, cfg) {
		t.Fatalf("derived config %+v\nwant %+v", src.Weights.Config, cfg)
	}
	tok := tinyTokenizer(t, cfg.Vocab)
	voices := map[string]*Voice{"alba": tinyVoice(cfg, 5), "marius-2": tinyVoice(cfg, 3)}
	text := TextOptions{RemoveSemicolons: true, FramesAfterEOS: 8}
	ggPath := filepath.Join(dir, "model.gguf")
	var buf bytes.Buffer
	if err := WriteGGUF(&buf, src.Weights, tok, voices, text); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ggPath, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Open(ggPath)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !reflect.DeepEqual(got.Weights.Config, cfg) {
		t.Errorf("config %+v\nwant %+v", got.Weights.Config, cfg)
	}
	a, b := src.Weights.All(), got.Weights.All()
	if len(a) != len(b) || len(a) != len(cfg.Layout()) {
		t.Fatalf("%d and %d tensors, layout %d", len(a), len(b), len(cfg.Layout()))
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].DType != b[i].DType || !slices.Equal(a[i].Shape, b[i].Shape) || !bytes.Equal(a[i].Data, b[i].Data) {
			t.Errorf("tensor %q: %v %v became %q %v %v", a[i].Name, a[i].DType, a[i].Shape, b[i].Name, b[i].DType, b[i].Shape)
		}
	}
	if got.Tokenizer == nil || !bytes.Equal(got.Tokenizer.Bytes(), tok.Bytes()) {
		t.Error("tokenizer not carried")
	}
	if !reflect.DeepEqual(got.Voices, voices) {
		t.Error("voices not carried")
	}
	if got.Text != text {
		t.Errorf("text settings %+v, want %+v", got.Text, text)
	}
	// Every GGUF name fits ggml's limit; a Mimi layer's name lost its repeated ".transformer".
	gf, err := gguf.Open(ggPath)
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	if _, ok := gf.Tensor("mimi.encoder_transformer.layers.0.self_attn.in_proj.weight"); !ok {
		t.Error("Mimi transformer names are not shortened")
	}
	// The reference's longest name fits too.
	if n := ggufName("mimi.encoder_transformer.transformer.layers.0.self_attn.in_proj.weight"); len(n) > gguf.MaxNameLen || checkpointName(n) != "mimi.encoder_transformer.transformer.layers.0.self_attn.in_proj.weight" {
		t.Errorf("name %q", n)
	}
}

// TestRefused: checkpoints that do not fit are refused, naming the tensor or key.
func TestRefused(t *testing.T) {
	cfg := tinyConfig()
	f32 := func(int) safetensors.DType { return safetensors.F32 }
	open := func(b []byte) error {
		f, err := safetensors.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		_, err = LoadSafetensors(f)
		return err
	}
	noEnc := cfg
	noEnc.Encoder, noEnc.EncoderLatentDim, noEnc.BOSBeforeVoice = false, 0, false
	if err := open(buildCheckpoint(t, noEnc, f32, nil)); err != nil {
		t.Errorf("a checkpoint without the encoder: %v", err)
	}
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"extra tensor", buildCheckpoint(t, cfg, f32, func(w *safetensors.Writer) {
			w.AddFloat32("flow_lm.unknown", []int64{1}, []float32{1})
		}), "flow_lm.unknown"},
		{"integer weights", buildCheckpoint(t, cfg, func(i int) safetensors.DType {
			if i == 3 {
				return safetensors.I32
			}
			return safetensors.F32
		}, nil), "flow_lm.emb_std"},
		{"extra layer", buildCheckpoint(t, cfg, f32, func(w *safetensors.Writer) {
			w.AddFloat32("flow_lm.transformer.layers.2.self_attn.in_proj.weight", []int64{384, 128}, make([]float32, 384*128))
		}), "flow_lm.transformer.layers.2.self_attn.out_proj.weight"},
		{"truncated", []byte{}, "too short"},
	}
	for _, c := range cases {
		var err error
		if len(c.b) == 0 {
			_, err = safetensors.Parse(c.b)
		} else {
			err = open(c.b)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error naming %q", c.name, err, c.want)
		}
	}
	// A tensor of the wrong shape is named with both shapes.
	layout := cfg.Layout()
	w := safetensors.NewWriter()
	for _, s := range layout {
		shape := make([]int64, len(s.Shape))
		n := 1
		for j, d := range s.Shape {
			shape[j] = int64(d)
			n *= d
		}
		if s.Name == "flow_lm.flow_net.res_blocks.1.mlp.2.weight" {
			shape[1]++
			n = int(shape[0] * shape[1])
		}
		w.AddFloat32(s.Name, shape, make([]float32, n))
	}
	var buf bytes.Buffer
	w.WriteTo(&buf)
	if err := open(buf.Bytes()); err == nil || !strings.Contains(err.Error(), "flow_lm.flow_net.res_blocks.1.mlp.2.weight") || !strings.Contains(err.Error(), "[16 17]") {
		t.Errorf("wrong shape: %v", err)
	}
	// GGUF: a stated width that disagrees with the tensors, another architecture.
	st, _ := safetensors.Parse(buildCheckpoint(t, cfg, f32, nil))
	wts, err := LoadSafetensors(st)
	if err != nil {
		t.Fatal(err)
	}
	wts.Config.Heads = 4 // heads are the file's word
	var gb bytes.Buffer
	if err := WriteGGUF(&gb, wts, tinyTokenizer(t, cfg.Vocab), nil, TextOptions{}); err != nil {
		t.Fatal(err)
	}
	gf, err := gguf.Parse(gb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	ck, err := LoadGGUF(gf)
	if err != nil || ck.Weights.Config.Heads != 4 {
		t.Errorf("heads from the file: %v", err)
	}
	if err := WriteGGUF(&gb, wts, tinyTokenizer(t, cfg.Vocab+1), nil, TextOptions{}); err == nil {
		t.Error("a tokenizer of another size was written")
	}
	if err := WriteGGUF(&gb, wts, tinyTokenizer(t, cfg.Vocab), map[string]*Voice{"a b": tinyVoice(cfg, 1)}, TextOptions{}); err == nil {
		t.Error("a voice name with a space was written")
	}
}

// TestVoiceRefused: voice files that do not fit the model.
func TestVoiceRefused(t *testing.T) {
	cfg := tinyConfig()
	write := func(edit func(w *safetensors.Writer)) error {
		w := safetensors.NewWriter()
		edit(w)
		var buf bytes.Buffer
		w.WriteTo(&buf)
		f, err := safetensors.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		_, err = ReadVoice(f, &cfg)
		return err
	}
	layer := func(w *safetensors.Writer, i, t, off int, val float32) {
		c := make([]float32, 2*t*cfg.Dim)
		for j := range c {
			c[j] = val
		}
		name := "transformer.layers." + string(rune('0'+i)) + ".self_attn"
		w.AddFloat32(name+"/cache", []int64{2, 1, int64(t), 2, 64}, c)
		w.AddInt64(name+"/offset", []int64{1}, []int64{int64(off)})
	}
	if err := write(func(w *safetensors.Writer) { layer(w, 0, 3, 3, 1); layer(w, 1, 4, 3, 1) }); err != nil {
		t.Errorf("a cache longer than its offset: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(w *safetensors.Writer)
		want string
	}{
		{"missing layer", func(w *safetensors.Writer) { layer(w, 0, 3, 3, 1) }, "layers.1.self_attn/cache is missing"},
		{"offsets differ", func(w *safetensors.Writer) { layer(w, 0, 3, 3, 1); layer(w, 1, 3, 2, 1) }, "offset 2"},
		{"offset past cache", func(w *safetensors.Writer) { layer(w, 0, 3, 4, 1); layer(w, 1, 3, 4, 1) }, "outside"},
		{"NaN", func(w *safetensors.Writer) { layer(w, 0, 3, 3, float32(math.NaN())); layer(w, 1, 3, 3, 1) }, "NaN"},
		{"layer out of range", func(w *safetensors.Writer) { layer(w, 0, 3, 3, 1); layer(w, 1, 3, 3, 1); layer(w, 2, 3, 3, 1) }, "unexpected tensor"},
	} {
		if err := write(c.edit); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		}
	}
}
