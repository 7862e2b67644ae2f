package pockettts

import (
	"fmt"
	"slices"
)

// Config is the model's shape. Load derives every width, depth and kernel from the checkpoint's
// tensors; what shapes cannot tell (head counts, the decoder's attention window, the sample rate,
// RoPE's base) is upstream's config, or a GGUF file's keys.
type Config struct {
	// FlowLM backbone (models/flow_lm.py, modules/transformer.py).
	Dim       int     // model width d (1024)
	Heads     int     // attention heads (16, of 64 dimensions)
	Layers    int     // transformer layers (6)
	FFDim     int     // feed-forward width (4096)
	Vocab     int     // text tokens (4000; the embedding has one row more, for padding)
	LatentDim int     // latent frame width (32)
	RoPEBase  float64 // RoPE's max period (10000)

	// Flow head (modules/mlp.py, SimpleMLPAdaLN).
	FlowDim   int // width (512)
	FlowDepth int // residual blocks (6)
	FlowFreqs int // frequencies of each time embedding (128; cos and sin make 256)

	// Mimi (models/mimi.py, modules/seanet.py).
	MimiDim        int   // transformer and SEANet width (512)
	MimiHeads      int   // attention heads (8)
	MimiLayers     int   // transformer layers, in the decoder and the encoder (2)
	MimiFFDim      int   // transformer feed-forward width (2048)
	MimiContext    int   // attention window in steps (250)
	Filters        int   // SEANet filters at full rate (64)
	Ratios         []int // SEANet decoder strides, first to last ([6 5 4]); the encoder's are reversed
	KernelSize     int   // SEANet first convolution's kernel (7)
	LastKernelSize int   // SEANet last convolution's kernel (3)
	ResKernelSize  int   // residual unit's first convolution's kernel (3)
	Compress       int   // residual unit's width divisor (2)
	UpsampleStride int   // latent-rate to SEANet-rate stride of upsample/downsample (16)
	SampleRate     int   // audio sample rate (24000)

	// Voice cloning.
	Encoder          bool // the Mimi encoder and speaker projection are present
	EncoderLatentDim int  // width of the encoder's latents (32; 512 in english_2026-01)
	BOSBeforeVoice   bool // a learnt vector precedes the voice prompt (flow_lm.bos_before_voice)
}

// English returns upstream's "english" configuration (english_2026-04), with the encoder.
func English() Config {
	return Config{
		Dim: 1024, Heads: 16, Layers: 6, FFDim: 4096, Vocab: 4000, LatentDim: 32, RoPEBase: 10000,
		FlowDim: 512, FlowDepth: 6, FlowFreqs: 128,
		MimiDim: 512, MimiHeads: 8, MimiLayers: 2, MimiFFDim: 2048, MimiContext: 250,
		Filters: 64, Ratios: []int{6, 5, 4}, KernelSize: 7, LastKernelSize: 3, ResKernelSize: 3, Compress: 2,
		UpsampleStride: 16, SampleRate: 24000,
		Encoder: true, EncoderLatentDim: 32, BOSBeforeVoice: true,
	}
}

// HeadDim is the FlowLM's attention head width.
func (c *Config) HeadDim() int { return c.Dim / c.Heads }

// Hop is the SEANet's total stride: samples per decoder step (120).
func (c *Config) Hop() int {
	h := 1
	for _, r := range c.Ratios {
		h *= r
	}
	return h
}

// FrameSamples is the audio samples of one latent frame (1920).
func (c *Config) FrameSamples() int { return c.Hop() * c.UpsampleStride }

// FrameRate is the latent frame rate in Hz (12.5).
func (c *Config) FrameRate() float64 { return float64(c.SampleRate) / float64(c.FrameSamples()) }

const maxWidth = 1 << 16

// check refuses configurations no upstream model has the arithmetic for.
func (c *Config) check() error {
	pos := []struct {
		name string
		v    int
	}{{"width", c.Dim}, {"heads", c.Heads}, {"layers", c.Layers}, {"feed-forward width", c.FFDim},
		{"vocabulary", c.Vocab}, {"latent width", c.LatentDim}, {"flow width", c.FlowDim},
		{"flow depth", c.FlowDepth}, {"flow frequencies", c.FlowFreqs}, {"Mimi width", c.MimiDim},
		{"Mimi heads", c.MimiHeads}, {"Mimi layers", c.MimiLayers}, {"Mimi feed-forward width", c.MimiFFDim},
		{"Mimi context", c.MimiContext}, {"SEANet filters", c.Filters}, {"kernel", c.KernelSize},
		{"last kernel", c.LastKernelSize}, {"residual kernel", c.ResKernelSize}, {"compression", c.Compress},
		{"upsample stride", c.UpsampleStride}, {"sample rate", c.SampleRate}}
	for _, p := range pos {
		if p.v <= 0 || p.v > maxWidth*64 {
			return fmt.Errorf("pockettts: %s %d is out of range", p.name, p.v)
		}
	}
	if c.Encoder && (c.EncoderLatentDim <= 0 || c.EncoderLatentDim > maxWidth) {
		return fmt.Errorf("pockettts: encoder latent width %d is out of range", c.EncoderLatentDim)
	}
	if c.Dim%c.Heads != 0 || c.HeadDim()%2 != 0 {
		return fmt.Errorf("pockettts: width %d does not split into %d heads of an even width", c.Dim, c.Heads)
	}
	if c.MimiDim%c.MimiHeads != 0 || (c.MimiDim/c.MimiHeads)%2 != 0 {
		return fmt.Errorf("pockettts: Mimi width %d does not split into %d heads of an even width", c.MimiDim, c.MimiHeads)
	}
	if len(c.Ratios) == 0 || len(c.Ratios) > 8 || slices.ContainsFunc(c.Ratios, func(r int) bool { return r <= 0 || r > 64 }) {
		return fmt.Errorf("pockettts: SEANet ratios %v are out of range", c.Ratios)
	}
	if c.Filters<<len(c.Ratios) > maxWidth || (c.Filters%c.Compress) != 0 {
		return fmt.Errorf("pockettts: %d SEANet filters over %d stages do not fit (compression %d)", c.Filters, len(c.Ratios), c.Compress)
	}
	if !(c.RoPEBase > 1) {
		return fmt.Errorf("pockettts: RoPE base %v must be above 1", c.RoPEBase)
	}
	return nil
}

// TensorSpec is one tensor of the checkpoint: its upstream name and shape (outermost first).
type TensorSpec struct {
	Name  string
	Shape []int
}

// Layout returns every tensor a TTSModel.state_dict() of this configuration holds, in upstream's
// order: what Load requires, no more and no less.
func (c *Config) Layout() []TensorSpec {
	var out []TensorSpec
	add := func(shape []int, format string, args ...any) {
		out = append(out, TensorSpec{fmt.Sprintf(format, args...), shape})
	}
	d, l, w := c.Dim, c.LatentDim, c.FlowDim
	add([]int{l}, "flow_lm.bos_emb")
	if c.BOSBeforeVoice {
		add([]int{1, 1, d}, "flow_lm.bos_before_voice")
	}
	if c.Encoder {
		add([]int{d, c.EncoderLatentDim}, "flow_lm.speaker_proj_weight")
	}
	add([]int{l}, "flow_lm.emb_std")
	add([]int{l}, "flow_lm.emb_mean")
	add([]int{c.Vocab + 1, d}, "flow_lm.conditioner.embed.weight")
	for i := range 2 {
		p := fmt.Sprintf("flow_lm.flow_net.time_embed.%d.", i)
		add([]int{c.FlowFreqs}, "%sfreqs", p)
		add([]int{w, 2 * c.FlowFreqs}, "%smlp.0.weight", p)
		add([]int{w}, "%smlp.0.bias", p)
		add([]int{w, w}, "%smlp.2.weight", p)
		add([]int{w}, "%smlp.2.bias", p)
		add([]int{w}, "%smlp.3.alpha", p)
	}
	add([]int{w, d}, "flow_lm.flow_net.cond_embed.weight")
	add([]int{w}, "flow_lm.flow_net.cond_embed.bias")
	add([]int{w, l}, "flow_lm.flow_net.input_proj.weight")
	add([]int{w}, "flow_lm.flow_net.input_proj.bias")
	for i := range c.FlowDepth {
		p := fmt.Sprintf("flow_lm.flow_net.res_blocks.%d.", i)
		add([]int{w}, "%sin_ln.weight", p)
		add([]int{w}, "%sin_ln.bias", p)
		add([]int{w, w}, "%smlp.0.weight", p)
		add([]int{w}, "%smlp.0.bias", p)
		add([]int{w, w}, "%smlp.2.weight", p)
		add([]int{w}, "%smlp.2.bias", p)
		add([]int{3 * w, w}, "%sadaLN_modulation.1.weight", p)
		add([]int{3 * w}, "%sadaLN_modulation.1.bias", p)
	}
	add([]int{l, w}, "flow_lm.flow_net.final_layer.linear.weight")
	add([]int{l}, "flow_lm.flow_net.final_layer.linear.bias")
	add([]int{2 * w, w}, "flow_lm.flow_net.final_layer.adaLN_modulation.1.weight")
	add([]int{2 * w}, "flow_lm.flow_net.final_layer.adaLN_modulation.1.bias")
	add([]int{d, l}, "flow_lm.input_linear.weight")
	for i := range c.Layers {
		p := fmt.Sprintf("flow_lm.transformer.layers.%d.", i)
		add([]int{3 * d, d}, "%sself_attn.in_proj.weight", p)
		add([]int{d, d}, "%sself_attn.out_proj.weight", p)
		add([]int{d}, "%snorm1.weight", p)
		add([]int{d}, "%snorm1.bias", p)
		add([]int{d}, "%snorm2.weight", p)
		add([]int{d}, "%snorm2.bias", p)
		add([]int{c.FFDim, d}, "%slinear1.weight", p)
		add([]int{d, c.FFDim}, "%slinear2.weight", p)
	}
	add([]int{d}, "flow_lm.out_norm.weight")
	add([]int{d}, "flow_lm.out_norm.bias")
	add([]int{1, d}, "flow_lm.out_eos.weight")
	add([]int{1}, "flow_lm.out_eos.bias")

	n := len(c.Ratios)
	m := c.MimiDim
	conv := func(prefix string, out, in, k int) {
		add([]int{out, in, k}, "%s.weight", prefix)
		add([]int{out}, "%s.bias", prefix)
	}
	res := func(prefix string, ch int) {
		conv(prefix+".block.1.conv", ch/c.Compress, ch, c.ResKernelSize)
		conv(prefix+".block.3.conv", ch, ch/c.Compress, 1)
	}
	if c.Encoder {
		conv("mimi.encoder.model.0.conv", c.Filters, 1, c.KernelSize)
		for j := range n {
			ch := c.Filters << j
			r := c.Ratios[n-1-j]
			res(fmt.Sprintf("mimi.encoder.model.%d", 1+3*j), ch)
			conv(fmt.Sprintf("mimi.encoder.model.%d.conv", 3+3*j), 2*ch, ch, 2*r)
		}
		conv(fmt.Sprintf("mimi.encoder.model.%d.conv", 3*n+2), m, c.Filters<<n, c.LastKernelSize)
	}
	conv("mimi.decoder.model.0.conv", c.Filters<<n, m, c.KernelSize)
	for j, r := range c.Ratios {
		in := c.Filters << (n - j)
		p := fmt.Sprintf("mimi.decoder.model.%d.convtr", 2+3*j)
		add([]int{in, in / 2, 2 * r}, "%s.weight", p)
		add([]int{in / 2}, "%s.bias", p)
		res(fmt.Sprintf("mimi.decoder.model.%d", 3+3*j), in/2)
	}
	conv(fmt.Sprintf("mimi.decoder.model.%d.conv", 3*n+2), 1, c.Filters, c.LastKernelSize)
	mimiLayers := func(prefix string) {
		for i := range c.MimiLayers {
			p := fmt.Sprintf("mimi.%s.transformer.layers.%d.", prefix, i)
			add([]int{3 * m, m}, "%sself_attn.in_proj.weight", p)
			add([]int{m, m}, "%sself_attn.out_proj.weight", p)
			add([]int{m}, "%snorm1.weight", p)
			add([]int{m}, "%snorm1.bias", p)
			add([]int{m}, "%snorm2.weight", p)
			add([]int{m}, "%snorm2.bias", p)
			add([]int{c.MimiFFDim, m}, "%slinear1.weight", p)
			add([]int{m, c.MimiFFDim}, "%slinear2.weight", p)
			add([]int{m}, "%slayer_scale_1.scale", p)
			add([]int{m}, "%slayer_scale_2.scale", p)
		}
	}
	if c.Encoder {
		mimiLayers("encoder_transformer")
	}
	mimiLayers("decoder_transformer")
	add([]int{m, l, 1}, "mimi.quantizer.output_proj.weight")
	if c.Encoder {
		add([]int{c.EncoderLatentDim, m, 2 * c.UpsampleStride}, "mimi.downsample.conv.conv.weight")
	}
	add([]int{m, 1, 2 * c.UpsampleStride}, "mimi.upsample.convtr.convtr.weight")
	return out
}
