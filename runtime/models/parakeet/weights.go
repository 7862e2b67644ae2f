package parakeet

import (
	"fmt"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Weights are a model's tensors by role, bound by NeMo's names (as whisper.cpp's converter keeps
// them) and checked against the hyper-parameters: every expected tensor present, no other, each
// of the type and shape parakeet_model_load creates it with (parakeet.cpp:1276-1395). Shapes are
// in ggml order; d = NAudioState, C = NSubsamplingChannels, P = NPredDim, V = NVocab,
// K = NConvKernel. The tensors' Data alias the file.
type Weights struct {
	PreOut     *ggml.Tensor // encoder.pre_encode.out.weight [PreEncodeFeatures, d], weight type
	PreOutBias *ggml.Tensor // [d]
	// PreConv are encoder.pre_encode.conv.{0,2,3,5,6}, F32: conv.0 [3,3,1,C] (1 → C channels,
	// 3×3 stride 2), conv.2 and conv.5 depthwise [3,3,1,C] (stride 2), conv.3 and conv.6
	// pointwise [1,1,C,C]; biases [1,1,C,1].
	PreConv [5]Conv
	Layers  []Layer
	Embed   *ggml.Tensor // decoder.prediction.embed.weight [P, V+1] (row V, the blank's, is zero in NeMo's models), pred type
	LSTM    []LSTMLayer
	// The joint: z = JointOut·relu(JointEnc·enc + JointEncBias + JointPred·h + JointPredBias) + JointOutBias.
	JointPred     *ggml.Tensor // joint.pred.weight [P, P], pred type
	JointPredBias *ggml.Tensor // [P]
	JointEnc      *ggml.Tensor // joint.enc.weight [d, P], weight type
	JointEncBias  *ggml.Tensor // [P]
	JointOut      *ggml.Tensor // joint.joint_net.2.weight [P, V+1+NTDTDurations], pred type
	JointOutBias  *ggml.Tensor // [V+1+NTDTDurations]
}

// Conv is a convolution's weight and bias.
type Conv struct{ Weight, Bias *ggml.Tensor }

// Layer is one FastConformer block (encoder.layers.N.*). Vectors are F32 [d]; matrices are of
// the weight type.
type Layer struct {
	NormFF1, NormFF1Bias   *ggml.Tensor
	FF1Up                  *ggml.Tensor // feed_forward1.linear1 [d, 4d]
	FF1Down                *ggml.Tensor // feed_forward1.linear2 [4d, d]
	NormConv, NormConvBias *ggml.Tensor
	ConvPW1                *ggml.Tensor // conv.pointwise_conv1 [d, 2d]: GLU's value half, then its gate half
	ConvDW                 *ggml.Tensor // conv.depthwise_conv.weight [K, d], F32
	BNWeight, BNBias       *ggml.Tensor // conv.batch_norm.{weight,bias}
	BNMean, BNVar          *ggml.Tensor // conv.batch_norm.running_{mean,var}
	BNBatches              *ggml.Tensor // conv.batch_norm.num_batches_tracked: one F32, unused
	ConvPW2                *ggml.Tensor // conv.pointwise_conv2 [d, d]
	NormAttn, NormAttnBias *ggml.Tensor
	PosBiasU, PosBiasV     *ggml.Tensor // self_attn.pos_bias_{u,v} [d/heads, heads], F32
	Q, K, V, Out, Pos      *ggml.Tensor // self_attn.linear_{q,k,v,out,pos} [d, d]
	NormFF2, NormFF2Bias   *ggml.Tensor
	FF2Up                  *ggml.Tensor // feed_forward2.linear1 [d, 4d]
	FF2Down                *ggml.Tensor // feed_forward2.linear2 [4d, d]
	NormOut, NormOutBias   *ggml.Tensor
}

// LSTMLayer is one layer of the prediction network. Gate blocks are in whisper.cpp's order
// [i, f, o, g] (its converter reorders PyTorch's [i, f, g, o]); Bias is bias_ih + bias_hh.
type LSTMLayer struct {
	WIH  *ggml.Tensor // dec_rnn.lstm.weight_ih_lN [P, 4P], pred type
	WHH  *ggml.Tensor // dec_rnn.lstm.weight_hh_lN [P, 4P], pred type
	Bias *ggml.Tensor // dec_rnn.lstm.bias_h_lN [4P], F32
}

// tensorSpec is one expected tensor: name, type and shape (ggml order, padded with 1s).
type tensorSpec struct {
	name string
	dt   tensor.DType
	ne   [4]int
	dst  **ggml.Tensor
}

// specs lists every tensor of a model with hyper-parameters h, in the order whisper.cpp creates
// them, pointing into w. h must be valid.
func specs(h HParams, w *Weights) ([]tensorSpec, error) {
	wt, err := h.WeightType()
	if err != nil {
		return nil, err
	}
	pt, _ := h.PredType()
	d, c, p, v, k := h.NAudioState, h.NSubsamplingChannels, h.NPredDim, h.NVocab, h.NConvKernel
	var s []tensorSpec
	add := func(name string, dt tensor.DType, dst **ggml.Tensor, ne ...int) {
		sp := tensorSpec{name: name, dt: dt, ne: [4]int{1, 1, 1, 1}, dst: dst}
		copy(sp.ne[:], ne)
		s = append(s, sp)
	}
	f32 := tensor.F32
	add("encoder.pre_encode.out.weight", wt, &w.PreOut, h.PreEncodeFeatures(), d)
	add("encoder.pre_encode.out.bias", f32, &w.PreOutBias, d)
	for i, n := range [5]int{0, 2, 3, 5, 6} {
		cv := &w.PreConv[i]
		name := fmt.Sprintf("encoder.pre_encode.conv.%d.", n)
		if n == 3 || n == 6 {
			add(name+"weight", f32, &cv.Weight, 1, 1, c, c)
		} else {
			add(name+"weight", f32, &cv.Weight, 3, 3, 1, c)
		}
		add(name+"bias", f32, &cv.Bias, 1, 1, c, 1)
	}
	w.Layers = make([]Layer, h.NAudioLayer)
	for i := range w.Layers {
		l := &w.Layers[i]
		pre := fmt.Sprintf("encoder.layers.%d.", i)
		add(pre+"norm_feed_forward1.weight", f32, &l.NormFF1, d)
		add(pre+"norm_feed_forward1.bias", f32, &l.NormFF1Bias, d)
		add(pre+"feed_forward1.linear1.weight", wt, &l.FF1Up, d, 4*d)
		add(pre+"feed_forward1.linear2.weight", wt, &l.FF1Down, 4*d, d)
		add(pre+"norm_conv.weight", f32, &l.NormConv, d)
		add(pre+"norm_conv.bias", f32, &l.NormConvBias, d)
		add(pre+"conv.pointwise_conv1.weight", wt, &l.ConvPW1, d, 2*d)
		add(pre+"conv.depthwise_conv.weight", f32, &l.ConvDW, k, d)
		add(pre+"conv.batch_norm.weight", f32, &l.BNWeight, d)
		add(pre+"conv.batch_norm.bias", f32, &l.BNBias, d)
		add(pre+"conv.batch_norm.running_mean", f32, &l.BNMean, d)
		add(pre+"conv.batch_norm.running_var", f32, &l.BNVar, d)
		add(pre+"conv.batch_norm.num_batches_tracked", f32, &l.BNBatches, 1)
		add(pre+"conv.pointwise_conv2.weight", wt, &l.ConvPW2, d, d)
		add(pre+"norm_self_att.weight", f32, &l.NormAttn, d)
		add(pre+"norm_self_att.bias", f32, &l.NormAttnBias, d)
		add(pre+"self_attn.pos_bias_u", f32, &l.PosBiasU, d/h.NAudioHead, h.NAudioHead)
		add(pre+"self_attn.pos_bias_v", f32, &l.PosBiasV, d/h.NAudioHead, h.NAudioHead)
		add(pre+"self_attn.linear_q.weight", wt, &l.Q, d, d)
		add(pre+"self_attn.linear_k.weight", wt, &l.K, d, d)
		add(pre+"self_attn.linear_v.weight", wt, &l.V, d, d)
		add(pre+"self_attn.linear_out.weight", wt, &l.Out, d, d)
		add(pre+"self_attn.linear_pos.weight", wt, &l.Pos, d, d)
		add(pre+"norm_feed_forward2.weight", f32, &l.NormFF2, d)
		add(pre+"norm_feed_forward2.bias", f32, &l.NormFF2Bias, d)
		add(pre+"feed_forward2.linear1.weight", wt, &l.FF2Up, d, 4*d)
		add(pre+"feed_forward2.linear2.weight", wt, &l.FF2Down, 4*d, d)
		add(pre+"norm_out.weight", f32, &l.NormOut, d)
		add(pre+"norm_out.bias", f32, &l.NormOutBias, d)
	}
	add("decoder.prediction.embed.weight", pt, &w.Embed, p, v+1)
	w.LSTM = make([]LSTMLayer, h.NPredLayers)
	for i := range w.LSTM {
		l := &w.LSTM[i]
		pre := "decoder.prediction.dec_rnn.lstm."
		add(fmt.Sprintf("%sweight_ih_l%d", pre, i), pt, &l.WIH, p, 4*p)
		add(fmt.Sprintf("%sweight_hh_l%d", pre, i), pt, &l.WHH, p, 4*p)
		add(fmt.Sprintf("%sbias_h_l%d", pre, i), f32, &l.Bias, 4*p)
	}
	add("joint.pred.weight", pt, &w.JointPred, p, p)
	add("joint.pred.bias", f32, &w.JointPredBias, p)
	add("joint.enc.weight", wt, &w.JointEnc, d, p)
	add("joint.enc.bias", f32, &w.JointEncBias, p)
	add("joint.joint_net.2.weight", pt, &w.JointOut, p, h.JointOutputs())
	add("joint.joint_net.2.bias", f32, &w.JointOutBias, h.JointOutputs())
	return s, nil
}

// TensorCount is the number of tensors a model with hyper-parameters h has.
func (h HParams) TensorCount() int { return 12 + 29*h.NAudioLayer + 1 + 3*h.NPredLayers + 6 }

// bindWeights checks ts (indexed by index) against the tensors h calls for and binds them.
func bindWeights(h HParams, ts []ggml.Tensor, index map[string]int) (*Weights, error) {
	w := &Weights{}
	sp, err := specs(h, w)
	if err != nil {
		return nil, err
	}
	want := make(map[string]int, len(sp))
	for i, s := range sp {
		want[s.name] = i
	}
	for i := range ts {
		if _, ok := want[ts[i].Name]; !ok {
			return nil, formatErr("unknown tensor %q (tensor %d)", ts[i].Name, i)
		}
	}
	for _, s := range sp {
		i, ok := index[s.name]
		if !ok {
			return nil, formatErr("tensor %q is missing (%d of the %d tensors the hyper-parameters call for are present)", s.name, len(ts), len(sp))
		}
		t := &ts[i]
		if t.Type != s.dt {
			return nil, formatErr("tensor %q is %v, want %v", s.name, t.Type, s.dt)
		}
		if len(t.Ne) > 4 || padded(t.Ne) != s.ne {
			return nil, formatErr("tensor %q has shape %v, want %v", s.name, t.Ne, trim(s.ne))
		}
		*s.dst = t
	}
	return w, nil
}

// padded returns ne padded to four dimensions with 1s, as ggml compares shapes.
func padded(ne []int) [4]int {
	p := [4]int{1, 1, 1, 1}
	copy(p[:], ne)
	return p
}

// trim drops trailing 1s (keeping one dimension), for messages.
func trim(ne [4]int) []int {
	n := 4
	for n > 1 && ne[n-1] == 1 {
		n--
	}
	return ne[:n]
}
