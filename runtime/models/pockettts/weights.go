package pockettts

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/safetensors"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Tensor is one weight as the file stores it. Data aliases the file (read-only, valid until the
// checkpoint is closed).
type Tensor struct {
	Name  string       // upstream's state_dict name
	Shape []int        // outermost first, as PyTorch: a Linear's weight is [out, in]
	DType tensor.DType // F32, F16 or BF16; Q8_0 or Q4_K for some matrices (see Quantize)
	Data  []byte       // little-endian
}

// Elements returns the number of values of t.
func (t *Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32s returns t's values as float32 (a new slice).
func (t *Tensor) Float32s() []float32 {
	out := make([]float32, t.Elements())
	le := binary.LittleEndian
	switch t.DType {
	case tensor.F32:
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(t.Data[4*i:]))
		}
	case tensor.F16:
		for i := range out {
			out[i] = safetensors.HalfToFloat32(le.Uint16(t.Data[2*i:]))
		}
	case tensor.BF16:
		for i := range out {
			out[i] = math.Float32frombits(uint32(le.Uint16(t.Data[2*i:])) << 16)
		}
	case tensor.Q8_0, tensor.Q4_K:
		// bind checked that Data holds whole rows of whole blocks
		_ = quant.Dequantize(t.DType, t.Data, out)
	}
	return out
}

// QuantizeFlowLM converts the FlowLM transformer's matrices of w to Q8_0 (the one type it
// takes) and returns how many it converted; matrices already Q8_0 are kept. The converted tensors
// own new memory; the others still alias the file.
func (w *Weights) QuantizeFlowLM(dt tensor.DType) (int, error) {
	if dt != tensor.Q8_0 {
		return 0, fmt.Errorf("pockettts: the FlowLM's matrices quantise to Q8_0 only, not %v", dt)
	}
	return w.quantize(func(name string) tensor.DType {
		if flowLMMatrix(name) {
			return tensor.Q8_0
		}
		return 0
	})
}

// QuantTypes are the types Quantize takes.
var QuantTypes = []tensor.DType{tensor.Q8_0, tensor.Q4_K}

// Quantize converts the matrices a frame step reads in full to dt or Q8_0 and returns how many
// it converted: with Q8_0, the FlowLM transformer's, the flow head's (but its time embedding's
// and its first and last projections, which are small) and the Mimi decoder transformer's; with
// Q4_K, the FlowLM transformer's to Q4_K and the others to Q8_0. The Mimi convolutions, the text
// embedding and the voice-cloning weights (the Mimi encoder, the speaker projection) keep the
// checkpoint's types. A matrix already of its target type is kept; one of the flow head or the
// Mimi decoder whose rows are not whole Q8_0 blocks stays F32. The converted tensors own new
// memory; the others still alias the file.
func (w *Weights) Quantize(dt tensor.DType) (int, error) {
	if !slices.Contains(QuantTypes, dt) {
		return 0, fmt.Errorf("pockettts: the matrices quantise to Q8_0 or Q4_K, not %v", dt)
	}
	return w.quantize(func(name string) tensor.DType {
		switch {
		case flowLMMatrix(name):
			return dt
		case stepMatrix(name):
			return tensor.Q8_0
		}
		return 0
	})
}

// quantize converts each matrix of w to target(its name) where that is not 0.
func (w *Weights) quantize(target func(name string) tensor.DType) (int, error) {
	n := 0
	for _, t := range w.All() {
		dt := target(t.Name)
		if dt == 0 || t.DType == dt {
			continue
		}
		cols := t.Shape[len(t.Shape)-1]
		if len(t.Shape) != 2 || cols%dt.BlockSize() != 0 {
			if !flowLMMatrix(t.Name) {
				continue
			}
			return n, fmt.Errorf("pockettts: tensor %q %v: rows of %d are not whole %v blocks", t.Name, t.Shape, cols, dt)
		}
		data, err := quant.QuantizeRows(dt, t.Float32s(), cols)
		if err != nil {
			return n, fmt.Errorf("pockettts: tensor %q: %w", t.Name, err)
		}
		t.Data, t.DType = data, dt
		n++
	}
	return n, nil
}

// flowLMMatrix reports whether tensor name is one of the FlowLM transformer's matrices, which the
// checkpoint may hold as Q8_0 or Q4_K (GGUF files only; see WriteGGUF).
func flowLMMatrix(name string) bool {
	rest, ok := strings.CutPrefix(name, "flow_lm.transformer.layers.")
	if !ok {
		return false
	}
	_, m, _ := strings.Cut(rest, ".")
	switch m {
	case "self_attn.in_proj.weight", "self_attn.out_proj.weight", "linear1.weight", "linear2.weight":
		return true
	}
	return false
}

// stepMatrix reports whether tensor name is a matrix of the flow head or of the Mimi decoder's
// transformer that the checkpoint may hold as Q8_0: those a frame step multiplies by, but the
// flow head's time embedding (computed in float64 at load) and its input and output projections.
func stepMatrix(name string) bool {
	if rest, ok := strings.CutPrefix(name, "mimi.decoder_transformer.transformer.layers."); ok {
		_, m, _ := strings.Cut(rest, ".")
		switch m {
		case "self_attn.in_proj.weight", "self_attn.out_proj.weight", "linear1.weight", "linear2.weight":
			return true
		}
		return false
	}
	if name == "flow_lm.flow_net.cond_embed.weight" || name == "flow_lm.flow_net.final_layer.adaLN_modulation.1.weight" {
		return true
	}
	if rest, ok := strings.CutPrefix(name, "flow_lm.flow_net.res_blocks."); ok {
		_, m, _ := strings.Cut(rest, ".")
		switch m {
		case "mlp.0.weight", "mlp.2.weight", "adaLN_modulation.1.weight":
			return true
		}
	}
	return false
}

// quantisedOK reports whether the checkpoint may hold tensor name, of shape shape, as dt.
func quantisedOK(name string, shape []int, dt tensor.DType) bool {
	var ok bool
	switch dt {
	case tensor.Q8_0:
		ok = flowLMMatrix(name) || stepMatrix(name)
	case tensor.Q4_K:
		ok = flowLMMatrix(name)
	}
	return ok && len(shape) == 2 && shape[1]%dt.BlockSize() == 0
}

// Linear is y = x Wᵀ + b. W is [out, in]; B is [out] or nil.
type Linear struct{ W, B *Tensor }

// Norm is a LayerNorm's gain and bias, each [width].
type Norm struct{ W, B *Tensor }

// Conv is a Conv1d: W [out, in, kernel], B [out] or nil.
type Conv struct {
	W, B   *Tensor
	Stride int
}

// ConvTr is a ConvTranspose1d: W [in, out/groups, kernel], B [out] or nil.
type ConvTr struct {
	W, B   *Tensor
	Stride int
}

// FlowLMLayer is one pre-norm layer of the FlowLM transformer (no biases but the norms').
type FlowLMLayer struct {
	Norm1, Norm2 Norm
	InProj       *Tensor // [3·d, d]: q, k, v stacked
	OutProj      *Tensor // [d, d]
	Linear1      *Tensor // [ff, d]
	Linear2      *Tensor // [d, ff]
}

// TimeEmbed is one time condition of the flow head: cos/sin features, two linears with SiLU
// between, and the RMS-style norm's gain.
type TimeEmbed struct {
	Freqs      *Tensor // [freqs]
	MLP0, MLP2 Linear  // [w, 2·freqs], [w, w]
	Alpha      *Tensor // [w]
}

// ResBlock is one AdaLN residual block of the flow head.
type ResBlock struct {
	InLN       Norm   // [w], eps 1e-6
	MLP0, MLP2 Linear // [w, w] each
	AdaLN      Linear // [3·w, w]: shift, scale, gate
}

// FlowHead is SimpleMLPAdaLN.
type FlowHead struct {
	TimeEmbed  [2]TimeEmbed
	CondEmbed  Linear // [w, d]
	InputProj  Linear // [w, latent]
	ResBlocks  []ResBlock
	FinalAdaLN Linear // [2·w, w]: shift, scale
	FinalProj  Linear // [latent, w]
}

// MimiLayer is one layer of a Mimi transformer: pre-norm, LayerScale on both branches.
type MimiLayer struct {
	Norm1, Norm2   Norm
	InProj         *Tensor // [3·m, m]
	OutProj        *Tensor // [m, m]
	Linear1        *Tensor // [ff, m]
	Linear2        *Tensor // [m, ff]
	Scale1, Scale2 *Tensor // [m]
}

// ResUnit is SEANet's residual unit: x + Conv2(ELU(Conv1(ELU(x)))).
type ResUnit struct {
	Conv1 Conv // [ch/compress, ch, resKernel]
	Conv2 Conv // [ch, ch/compress, 1]
}

// DecoderStage is ELU, a transposed convolution that upsamples by its stride, a residual unit.
type DecoderStage struct {
	Up  ConvTr
	Res ResUnit
}

// EncoderStage is a residual unit, ELU, a strided convolution that downsamples.
type EncoderStage struct {
	Res  ResUnit
	Down Conv
}

// Mimi holds the codec's decoder and, for voice cloning, its encoder.
type Mimi struct {
	QuantizerProj *Tensor // [m, latent, 1]: Conv1d k=1, no bias
	Upsample      ConvTr  // [m, 1, 2·stride], depthwise, no bias
	DecoderLayers []MimiLayer
	DecoderIn     Conv // [filters·2ⁿ, m, kernel]
	Decoder       []DecoderStage
	DecoderOut    Conv // [1, filters, lastKernel]

	// Voice cloning; empty without the encoder.
	EncoderIn     Conv // [filters, 1, kernel]
	Encoder       []EncoderStage
	EncoderOut    Conv // [m, filters·2ⁿ, lastKernel]
	EncoderLayers []MimiLayer
	Downsample    Conv // [encLatent, m, 2·stride], no bias
}

// Weights is a whole checkpoint, bound to its roles and checked against Config.
type Weights struct {
	Config Config

	// release gives back the resident pages of file data the model no longer reads (the rows of
	// a matrix the backend repacked); nil where nothing is mapped. A no-op outside the mapping.
	release func([]byte)

	BOSEmb         *Tensor // [latent]: the latent input of the first frame step
	BOSBeforeVoice *Tensor // [1, 1, d] or nil
	SpeakerProj    *Tensor // [d, encLatent] or nil: voice latents to conditioning
	EmbStd         *Tensor // [latent]
	EmbMean        *Tensor // [latent]
	Embed          *Tensor // [vocab+1, d]
	InputLinear    *Tensor // [d, latent]
	Layers         []FlowLMLayer
	OutNorm        Norm
	OutEOS         Linear // [1, d], [1]
	Flow           FlowHead
	Mimi           Mimi
}

// source is a checkpoint's tensors by upstream name.
type source interface {
	tensor(name string) (*Tensor, bool)
	names() []string
}

// upstreamHeadDim is the attention head width of every upstream configuration.
const upstreamHeadDim = 64

// deriveConfig reads the configuration off the tensors' shapes, filling what they cannot tell
// from base (English() for a safetensors file, the keys for GGUF). Head counts of 0 in base are
// the width over 64, as upstream's configurations have them.
func deriveConfig(src source, base Config) (Config, error) {
	c := base
	dims := func(name string, n int) ([]int, error) {
		t, ok := src.tensor(name)
		if !ok {
			return nil, fmt.Errorf("pockettts: tensor %q is missing", name)
		}
		if len(t.Shape) != n {
			return nil, fmt.Errorf("pockettts: tensor %q has shape %v, want %d dimensions", name, t.Shape, n)
		}
		return t.Shape, nil
	}
	count := func(format string) int {
		n := 0
		for n < 256 {
			if _, ok := src.tensor(fmt.Sprintf(format, n)); !ok {
				break
			}
			n++
		}
		return n
	}
	emb, err := dims("flow_lm.conditioner.embed.weight", 2)
	if err != nil {
		return c, err
	}
	c.Vocab, c.Dim = emb[0]-1, emb[1]
	if c.Heads == 0 {
		c.Heads = c.Dim / upstreamHeadDim
	}
	in, err := dims("flow_lm.input_linear.weight", 2)
	if err != nil {
		return c, err
	}
	c.LatentDim = in[1]
	c.Layers = count("flow_lm.transformer.layers.%d.self_attn.in_proj.weight")
	l1, err := dims("flow_lm.transformer.layers.0.linear1.weight", 2)
	if err != nil {
		return c, err
	}
	c.FFDim = l1[0]
	ip, err := dims("flow_lm.flow_net.input_proj.weight", 2)
	if err != nil {
		return c, err
	}
	c.FlowDim = ip[0]
	c.FlowDepth = count("flow_lm.flow_net.res_blocks.%d.in_ln.weight")
	fr, err := dims("flow_lm.flow_net.time_embed.0.freqs", 1)
	if err != nil {
		return c, err
	}
	c.FlowFreqs = fr[0]

	up, err := dims("mimi.upsample.convtr.convtr.weight", 3)
	if err != nil {
		return c, err
	}
	c.MimiDim, c.UpsampleStride = up[0], up[2]/2
	if c.MimiHeads == 0 {
		c.MimiHeads = c.MimiDim / upstreamHeadDim
	}
	c.MimiLayers = count("mimi.decoder_transformer.transformer.layers.%d.self_attn.in_proj.weight")
	ml1, err := dims("mimi.decoder_transformer.transformer.layers.0.linear1.weight", 2)
	if err != nil {
		return c, err
	}
	c.MimiFFDim = ml1[0]
	c.Ratios = nil
	for j := 0; j < 8; j++ {
		w, ok := src.tensor(fmt.Sprintf("mimi.decoder.model.%d.convtr.weight", 2+3*j))
		if !ok {
			break
		}
		if len(w.Shape) != 3 || w.Shape[2]%2 != 0 {
			return c, fmt.Errorf("pockettts: tensor %q has shape %v, want [in, out, 2·stride]", w.Name, w.Shape)
		}
		c.Ratios = append(c.Ratios, w.Shape[2]/2)
	}
	n := len(c.Ratios)
	d0, err := dims("mimi.decoder.model.0.conv.weight", 3)
	if err != nil {
		return c, err
	}
	c.KernelSize = d0[2]
	last, err := dims(fmt.Sprintf("mimi.decoder.model.%d.conv.weight", 3*n+2), 3)
	if err != nil {
		return c, err
	}
	c.Filters, c.LastKernelSize = last[1], last[2]
	r1, err := dims("mimi.decoder.model.3.block.1.conv.weight", 3)
	if err != nil {
		return c, err
	}
	if r1[0] <= 0 || r1[1]%r1[0] != 0 {
		return c, fmt.Errorf("pockettts: tensor %q has shape %v: the residual unit's width does not divide", "mimi.decoder.model.3.block.1.conv.weight", r1)
	}
	c.Compress, c.ResKernelSize = r1[1]/r1[0], r1[2]

	_, c.BOSBeforeVoice = src.tensor("flow_lm.bos_before_voice")
	_, c.Encoder = src.tensor("mimi.encoder.model.0.conv.weight")
	if c.Encoder {
		sp, err := dims("flow_lm.speaker_proj_weight", 2)
		if err != nil {
			return c, err
		}
		c.EncoderLatentDim = sp[1]
	} else {
		c.EncoderLatentDim = 0
	}
	return c, c.check()
}

// bind checks src against cfg's layout (every tensor present with its shape and a float dtype,
// nothing else) and fills the weights.
func bind(src source, cfg Config) (*Weights, error) {
	layout := cfg.Layout()
	want := make(map[string]bool, len(layout))
	for _, s := range layout {
		want[s.Name] = true
		t, ok := src.tensor(s.Name)
		if !ok {
			return nil, fmt.Errorf("pockettts: tensor %q is missing", s.Name)
		}
		if !slices.Equal(t.Shape, s.Shape) {
			return nil, fmt.Errorf("pockettts: tensor %q has shape %v, the configuration needs %v", s.Name, t.Shape, s.Shape)
		}
		switch {
		case t.DType == tensor.F32, t.DType == tensor.F16, t.DType == tensor.BF16:
		case quantisedOK(s.Name, s.Shape, t.DType):
		default:
			return nil, fmt.Errorf("pockettts: tensor %q is %v; weights must be F32, F16 or BF16 (Q8_0 or Q4_K only for the FlowLM transformer's matrices, Q8_0 for the flow head's and the Mimi decoder transformer's)", s.Name, t.DType)
		}
		if want, err := t.DType.RowSize(int64(t.Elements())); err != nil || int64(len(t.Data)) != want {
			return nil, fmt.Errorf("pockettts: tensor %q has %d bytes, its shape %v of %v needs %d", s.Name, len(t.Data), t.Shape, t.DType, want)
		}
	}
	var extra []string
	for _, n := range src.names() {
		if !want[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		if len(extra) > 5 {
			extra = append(extra[:5], fmt.Sprintf("and %d more", len(extra)-5))
		}
		return nil, fmt.Errorf("pockettts: the checkpoint has tensors this configuration does not use: %s", strings.Join(extra, ", "))
	}
	get := func(name string) *Tensor {
		t, _ := src.tensor(name)
		return t
	}
	opt := func(name string) *Tensor {
		t, ok := src.tensor(name)
		if !ok {
			return nil
		}
		return t
	}
	lin := func(p string) Linear { return Linear{get(p + ".weight"), get(p + ".bias")} }
	norm := func(p string) Norm { return Norm{get(p + ".weight"), get(p + ".bias")} }
	conv := func(p string, stride int) Conv { return Conv{get(p + ".weight"), get(p + ".bias"), stride} }
	res := func(p string) ResUnit { return ResUnit{conv(p+".block.1.conv", 1), conv(p+".block.3.conv", 1)} }
	mimiLayers := func(prefix string) []MimiLayer {
		out := make([]MimiLayer, cfg.MimiLayers)
		for i := range out {
			p := fmt.Sprintf("mimi.%s.transformer.layers.%d.", prefix, i)
			out[i] = MimiLayer{
				Norm1: norm(p + "norm1"), Norm2: norm(p + "norm2"),
				InProj: get(p + "self_attn.in_proj.weight"), OutProj: get(p + "self_attn.out_proj.weight"),
				Linear1: get(p + "linear1.weight"), Linear2: get(p + "linear2.weight"),
				Scale1: get(p + "layer_scale_1.scale"), Scale2: get(p + "layer_scale_2.scale"),
			}
		}
		return out
	}

	w := &Weights{
		Config:         cfg,
		BOSEmb:         get("flow_lm.bos_emb"),
		BOSBeforeVoice: opt("flow_lm.bos_before_voice"),
		SpeakerProj:    opt("flow_lm.speaker_proj_weight"),
		EmbStd:         get("flow_lm.emb_std"),
		EmbMean:        get("flow_lm.emb_mean"),
		Embed:          get("flow_lm.conditioner.embed.weight"),
		InputLinear:    get("flow_lm.input_linear.weight"),
		OutNorm:        norm("flow_lm.out_norm"),
		OutEOS:         lin("flow_lm.out_eos"),
	}
	for i := range cfg.Layers {
		p := fmt.Sprintf("flow_lm.transformer.layers.%d.", i)
		w.Layers = append(w.Layers, FlowLMLayer{
			Norm1: norm(p + "norm1"), Norm2: norm(p + "norm2"),
			InProj: get(p + "self_attn.in_proj.weight"), OutProj: get(p + "self_attn.out_proj.weight"),
			Linear1: get(p + "linear1.weight"), Linear2: get(p + "linear2.weight"),
		})
	}
	f := &w.Flow
	for i := range f.TimeEmbed {
		p := fmt.Sprintf("flow_lm.flow_net.time_embed.%d.", i)
		f.TimeEmbed[i] = TimeEmbed{Freqs: get(p + "freqs"), MLP0: lin(p + "mlp.0"), MLP2: lin(p + "mlp.2"), Alpha: get(p + "mlp.3.alpha")}
	}
	f.CondEmbed = lin("flow_lm.flow_net.cond_embed")
	f.InputProj = lin("flow_lm.flow_net.input_proj")
	for i := range cfg.FlowDepth {
		p := fmt.Sprintf("flow_lm.flow_net.res_blocks.%d.", i)
		f.ResBlocks = append(f.ResBlocks, ResBlock{InLN: norm(p + "in_ln"), MLP0: lin(p + "mlp.0"), MLP2: lin(p + "mlp.2"), AdaLN: lin(p + "adaLN_modulation.1")})
	}
	f.FinalAdaLN = lin("flow_lm.flow_net.final_layer.adaLN_modulation.1")
	f.FinalProj = lin("flow_lm.flow_net.final_layer.linear")

	m := &w.Mimi
	n := len(cfg.Ratios)
	m.QuantizerProj = get("mimi.quantizer.output_proj.weight")
	m.Upsample = ConvTr{W: get("mimi.upsample.convtr.convtr.weight"), Stride: cfg.UpsampleStride}
	m.DecoderLayers = mimiLayers("decoder_transformer")
	m.DecoderIn = conv("mimi.decoder.model.0.conv", 1)
	for j, r := range cfg.Ratios {
		p := fmt.Sprintf("mimi.decoder.model.%d.convtr", 2+3*j)
		m.Decoder = append(m.Decoder, DecoderStage{
			Up:  ConvTr{get(p + ".weight"), get(p + ".bias"), r},
			Res: res(fmt.Sprintf("mimi.decoder.model.%d", 3+3*j)),
		})
	}
	m.DecoderOut = conv(fmt.Sprintf("mimi.decoder.model.%d.conv", 3*n+2), 1)
	if cfg.Encoder {
		m.EncoderIn = conv("mimi.encoder.model.0.conv", 1)
		for j := range n {
			m.Encoder = append(m.Encoder, EncoderStage{
				Res:  res(fmt.Sprintf("mimi.encoder.model.%d", 1+3*j)),
				Down: conv(fmt.Sprintf("mimi.encoder.model.%d.conv", 3+3*j), cfg.Ratios[n-1-j]),
			})
		}
		m.EncoderOut = conv(fmt.Sprintf("mimi.encoder.model.%d.conv", 3*n+2), 1)
		m.EncoderLayers = mimiLayers("encoder_transformer")
		m.Downsample = Conv{W: get("mimi.downsample.conv.conv.weight"), Stride: cfg.UpsampleStride}
	}
	return w, nil
}

// safetensorsSource serves a safetensors checkpoint's tensors.
type safetensorsSource struct {
	f       *safetensors.File
	tensors map[string]*Tensor
	order   []string
}

func newSafetensorsSource(f *safetensors.File) (*safetensorsSource, error) {
	s := &safetensorsSource{f: f, tensors: make(map[string]*Tensor, len(f.Tensors))}
	for i := range f.Tensors {
		st := &f.Tensors[i]
		var dt tensor.DType
		switch st.DType {
		case safetensors.F32:
			dt = tensor.F32
		case safetensors.F16:
			dt = tensor.F16
		case safetensors.BF16:
			dt = tensor.BF16
		default:
			return nil, fmt.Errorf("pockettts: tensor %q is %s; weights must be F32, F16 or BF16", st.Name, st.DType)
		}
		shape := make([]int, len(st.Shape))
		for j, d := range st.Shape {
			if d > math.MaxInt32 {
				return nil, fmt.Errorf("pockettts: tensor %q has shape %v", st.Name, st.Shape)
			}
			shape[j] = int(d)
		}
		s.tensors[st.Name] = &Tensor{Name: st.Name, Shape: shape, DType: dt, Data: f.Data(st)}
		s.order = append(s.order, st.Name)
	}
	return s, nil
}

func (s *safetensorsSource) tensor(name string) (*Tensor, bool) {
	t, ok := s.tensors[name]
	return t, ok
}

func (s *safetensorsSource) names() []string { return s.order }

// LoadSafetensors binds an opened TTSModel.state_dict() file (upstream's model.safetensors). The
// weights alias f, which must stay open while they are used. The attention window, RoPE's base and
// the sample rate are upstream's (English()), heads are 64 wide; the rest comes from the shapes.
func LoadSafetensors(f *safetensors.File) (*Weights, error) {
	src, err := newSafetensorsSource(f)
	if err != nil {
		return nil, err
	}
	base := English()
	base.Heads, base.MimiHeads = 0, 0
	cfg, err := deriveConfig(src, base)
	if err != nil {
		return nil, err
	}
	w, err := bind(src, cfg)
	if err != nil {
		return nil, err
	}
	w.release = f.Release
	return w, nil
}
