package parakeet

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Constants whisper.cpp's front end fixes rather than reads from the file (parakeet.h:33-34).
const (
	SampleRate = 16000 // Hz
	HopLength  = 160   // samples between mel frames (10 ms)
)

// Subsampling is the encoder's time reduction: three stride-2 convolutions
// (parakeet.cpp:1546-1583), one encoder frame per 8 mel frames.
const Subsampling = 8

// ErrFormat is wrapped by every error that reports a malformed model file (the container's own
// errors, ggml.ErrFormat and gguf.ErrFormat, are wrapped as well).
var ErrFormat = errors.New("parakeet: malformed model file")

// FormatError reports a malformed model file.
type FormatError struct {
	Msg string
	Err error // the container reader's error, if it found the problem
}

func (e *FormatError) Error() string {
	if e.Err != nil {
		return "parakeet: " + e.Msg + ": " + e.Err.Error()
	}
	return "parakeet: " + e.Msg
}

// Unwrap returns ErrFormat and the container reader's error.
func (e *FormatError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrFormat}
	}
	return []error{ErrFormat, e.Err}
}

func formatErr(format string, args ...any) error {
	return &FormatError{Msg: fmt.Sprintf(format, args...)}
}

// HParams are the fifteen int32 hyper-parameters of whisper.cpp's file, in file order
// (parakeet_model_load, parakeet.cpp:1039-1056).
type HParams struct {
	NVocab      int // SentencePiece pieces; the blank is id NVocab
	NAudioCtx   int // mel frames the encoder takes in one pass before whisper.cpp switches paths
	NAudioState int // d_model
	NAudioHead  int
	NAudioLayer int
	NMels       int
	// FType is ggml's file type of the large matrices, plus the quantisation version times 1000
	// in quantised files.
	FType                int
	NFFT                 int
	SubsamplingFactor    int
	NSubsamplingChannels int
	NConvKernel          int // the conformer's depthwise convolution
	NPredDim             int // LSTM width, also the joint's hidden width
	NPredLayers          int
	NTDTDurations        int // 0 in a plain RNN-T file
	NMaxTokens           int // most zero-duration tokens emitted at one frame
}

// hparamNames are the fields' names as whisper.cpp's loader prints them.
var hparamNames = [15]string{"n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer",
	"n_mels", "ftype", "n_fft", "subsampling_factor", "n_subsampling_channels", "n_conv_kernel",
	"n_pred_dim", "n_pred_layers", "n_tdt_durations", "n_max_tokens"}

func (h *HParams) fields() [15]*int {
	return [15]*int{&h.NVocab, &h.NAudioCtx, &h.NAudioState, &h.NAudioHead, &h.NAudioLayer, &h.NMels,
		&h.FType, &h.NFFT, &h.SubsamplingFactor, &h.NSubsamplingChannels, &h.NConvKernel, &h.NPredDim,
		&h.NPredLayers, &h.NTDTDurations, &h.NMaxTokens}
}

// Fields returns the hyper-parameters' names, as whisper.cpp prints them, and values, in file
// order.
func (h HParams) Fields() (names [15]string, values [15]int) {
	for i, p := range h.fields() {
		values[i] = *p
	}
	return hparamNames, values
}

// hparamMax bounds each field. whisper.cpp accepts at most the parakeet-tdt-0.6b values
// (PARAKEET_HPARAM_MODEL_VALUES, parakeet-arch.h:224); these bounds are wider, to admit the
// larger members of the family (parakeet-tdt-1.1b has 42 layers), and only keep a file from
// asking for absurd sizes: the tensors are checked against the values either way. The ftype
// entry is unused (ftypes decides).
var hparamMax = [15]int{1 << 16, 1 << 20, 8192, 128, 256, 1024, 0, 1 << 16, Subsampling, 4096, 255,
	8192, 16, 64, 1000}

// ftypes maps the ggml_ftype values whisper.cpp's Parakeet loader takes, and parakeet-quantize
// writes, to the type of the large matrices.
var ftypes = map[int]tensor.DType{
	0: tensor.F32, 1: tensor.F16,
	2: tensor.Q4_0, 3: tensor.Q4_1, 7: tensor.Q8_0, 8: tensor.Q5_0, 9: tensor.Q5_1,
	10: tensor.Q2_K, 11: tensor.Q3_K, 12: tensor.Q4_K, 13: tensor.Q5_K, 14: tensor.Q6_K,
}

// fileTypes are the tensor types a file may hold.
var fileTypes = []tensor.DType{tensor.F32, tensor.F16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1,
	tensor.Q8_0, tensor.Q2_K, tensor.Q3_K, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K}

// quantVersionFactor is what the quantisation version is multiplied by in FType.
const quantVersionFactor = 1000

// WeightType is the type of the large matrices (the encoder's linear layers and
// joint.enc.weight).
func (h HParams) WeightType() (tensor.DType, error) {
	dt, ok := ftypes[h.FType%quantVersionFactor]
	if !ok || h.FType < 0 {
		return 0, fmt.Errorf("parakeet: ftype %d names no weight type whisper.cpp's Parakeet loader takes", h.FType)
	}
	return dt, nil
}

// PredType is the type of the prediction network's and the joint's matrices: the weight type,
// unless it is a block type whose block does not divide NPredDim (640 for the k-quants), where
// whisper.cpp keeps them F32 (parakeet.cpp:1371-1372).
func (h HParams) PredType() (tensor.DType, error) {
	wt, err := h.WeightType()
	if err != nil {
		return 0, err
	}
	if b := wt.BlockSize(); b > 1 && h.NPredDim%b != 0 {
		return tensor.F32, nil
	}
	return wt, nil
}

// QuantVersion is the quantisation version folded into FType (0 in F32 and F16 files).
func (h HParams) QuantVersion() int { return h.FType / quantVersionFactor }

// JointOutputs is the width of a joint-network output row: NVocab token logits, the blank's, then
// NTDTDurations duration logits.
func (h HParams) JointOutputs() int { return h.NVocab + 1 + h.NTDTDurations }

// PreEncodeFeatures is the input width of encoder.pre_encode.out: channels × the mel bins left
// after subsampling (parakeet.cpp:1277).
func (h HParams) PreEncodeFeatures() int { return h.NMels / Subsampling * h.NSubsamplingChannels }

// Validate checks every field against its bounds and the relations the encoder relies on.
func (h HParams) Validate() error {
	if i, why := h.check(); i >= 0 {
		return formatErr("hyperparameter %s: %s", hparamNames[i], why)
	}
	return nil
}

// check returns the index of the first field that is out of range, or of the field a broken
// relation is reported against, and why; -1 if there is none.
func (h HParams) check() (int, string) {
	for i, p := range h.fields() {
		v := *p
		if i == 6 {
			if _, err := h.WeightType(); err != nil {
				return i, fmt.Sprintf("%d names no weight type whisper.cpp's Parakeet loader takes (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K)", v)
			}
			continue
		}
		low := 1
		if i == 13 {
			low = 0 // a plain RNN-T
		}
		if v < low || v > hparamMax[i] {
			return i, fmt.Sprintf("%d, want %d to %d", v, low, hparamMax[i])
		}
	}
	switch {
	case h.SubsamplingFactor != Subsampling:
		return 8, fmt.Sprintf("%d: the encoder's three stride-2 convolutions subsample by %d", h.SubsamplingFactor, Subsampling)
	case h.NMels%Subsampling != 0:
		return 5, fmt.Sprintf("%d is not a multiple of the subsampling factor %d", h.NMels, Subsampling)
	case h.NAudioState%h.NAudioHead != 0:
		return 2, fmt.Sprintf("%d is not a multiple of n_audio_head = %d", h.NAudioState, h.NAudioHead)
	case h.NAudioState%2 != 0:
		return 2, fmt.Sprintf("%d is odd: positions are encoded in sine/cosine pairs", h.NAudioState)
	case h.NConvKernel%2 == 0:
		return 10, fmt.Sprintf("%d is even: the depthwise convolution is padded (k-1)/2 on each side", h.NConvKernel)
	case h.NFFT%2 != 0:
		return 7, fmt.Sprintf("%d is odd", h.NFFT)
	}
	return -1, ""
}
