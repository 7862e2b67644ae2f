package whisper

import (
	"fmt"
	"math"
	"slices"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Word-level timing by cross-attention alignment: the window's text tokens are run through the
// decoder once more, teacher-forced after <|startoftranscript|> (and the language token of a
// multilingual model) and <|notimestamps|>; the cross-attention weights of the model's alignment
// heads (decoder heads whose attention follows the speech) are normalised and averaged into a
// token × audio-frame matrix (Aligner.Attention). Dynamic time warping then finds the monotonic
// path through it, which times the tokens; that is the scheduler's (runtime/sched/asr), as in
// whisper.cpp's DTW timing.

// AlignHead names one decoder attention head: its layer and its index within the layer.
type AlignHead struct{ Layer, Head int }

// Alignment heads as published with the OpenAI checkpoints, by model size and vocabulary.
var alignPresets = map[string][]AlignHead{
	"tiny.en":  {{1, 0}, {2, 0}, {2, 5}, {3, 0}, {3, 1}, {3, 2}, {3, 3}, {3, 4}},
	"tiny":     {{2, 2}, {3, 0}, {3, 2}, {3, 3}, {3, 4}, {3, 5}},
	"base.en":  {{3, 3}, {4, 7}, {5, 1}, {5, 5}, {5, 7}},
	"base":     {{3, 1}, {4, 2}, {4, 3}, {4, 7}, {5, 1}, {5, 2}, {5, 4}, {5, 6}},
	"small.en": {{6, 6}, {7, 0}, {7, 3}, {7, 8}, {8, 2}, {8, 5}, {8, 7}, {9, 0}, {9, 4}, {9, 8}, {9, 10}, {10, 0}, {10, 1}, {10, 2}, {10, 3}, {10, 6}, {10, 11}, {11, 2}, {11, 4}},
	"small":    {{5, 3}, {5, 9}, {8, 0}, {8, 4}, {8, 7}, {8, 8}, {9, 0}, {9, 7}, {9, 9}, {10, 5}},
	"medium.en": {{11, 4}, {14, 1}, {14, 12}, {14, 14}, {15, 4}, {16, 0}, {16, 4}, {16, 9}, {17, 12}, {17, 14},
		{18, 7}, {18, 10}, {18, 15}, {20, 0}, {20, 3}, {20, 9}, {20, 14}, {21, 12}},
	"medium":         {{13, 15}, {15, 4}, {15, 15}, {16, 1}, {20, 0}, {23, 4}},
	"large-v3":       {{7, 0}, {10, 17}, {12, 18}, {13, 12}, {16, 1}, {17, 14}, {19, 11}, {21, 4}, {24, 1}, {25, 6}},
	"large-v3-turbo": {{2, 4}, {2, 11}, {3, 3}, {3, 6}, {3, 11}, {3, 14}},
}

// AlignHeads returns the alignment heads for m: the published ones for its size (recognised by
// its text decoder's shape, vocabulary and mel count), otherwise every head of the second half of
// the decoder's layers. Large v1 and v2 share a shape and differ in their heads, so they get the
// latter too.
func (m *Model) AlignHeads() []AlignHead {
	size := ""
	switch {
	case m.TextLayer == 4 && m.TextState == 384:
		size = "tiny"
	case m.TextLayer == 6 && m.TextState == 512:
		size = "base"
	case m.TextLayer == 12 && m.TextState == 768:
		size = "small"
	case m.TextLayer == 24 && m.TextState == 1024:
		size = "medium"
	case m.TextLayer == 32 && m.TextState == 1280 && m.Mels == 128:
		size = "large-v3"
	case m.TextLayer == 4 && m.TextState == 1280 && m.Mels == 128:
		size = "large-v3-turbo"
	}
	if size != "" && !m.Multilingual() && size != "large-v3" && size != "large-v3-turbo" {
		size += ".en"
	}
	if hs, ok := alignPresets[size]; ok && m.TextHead > 0 {
		ok := true
		for _, h := range hs {
			ok = ok && h.Layer < m.TextLayer && h.Head < m.TextHead
		}
		if ok {
			return hs
		}
	}
	var hs []AlignHead
	for l := m.TextLayer / 2; l < m.TextLayer; l++ {
		for h := range m.TextHead {
			hs = append(hs, AlignHead{l, h})
		}
	}
	return hs
}

// Aligner computes what word timing needs of a window: the cross-attention of its alignment
// heads over the text. It holds its own decoder (a whole window's tokens in one pass), the
// captured cross-attention queries and the window's keys. One goroutine uses it at a time.
type Aligner struct {
	m     *Model
	dec   *Decoder
	heads []AlignHead
	layer []bool      // layer has an alignment head
	q     [][]float32 // [layer] captured queries [n, T]
	kf    backend.Tensor
	k     []float32 // [AudioCtx, T] keys of one layer
	bb    kvcache.BatchBuilder
}

// NewAligner makes an aligner for m.
func NewAligner(m *Model) (*Aligner, error) {
	dec, err := m.NewDecoder(DecoderConfig{StepTokens: m.TextCtx, MaxSeqs: 1, KVSlots: m.TextCtx})
	if err != nil {
		return nil, err
	}
	kf, err := m.be.Alloc(tensor.F32, m.AudioCtx, m.TextState)
	if err != nil {
		dec.Close()
		return nil, err
	}
	a := &Aligner{m: m, dec: dec, heads: m.AlignHeads(), layer: make([]bool, m.TextLayer), q: make([][]float32, m.TextLayer),
		kf: kf, k: make([]float32, m.AudioCtx*m.TextState)}
	for _, h := range a.heads {
		a.layer[h.Layer] = true
	}
	return a, nil
}

// Close releases the aligner's decoder and scratch.
func (a *Aligner) Close() error {
	err := a.dec.Close()
	if e := a.kf.Close(); err == nil {
		err = e
	}
	return err
}

// Attention runs tokens (sot sequence, <|notimestamps|>, text, <|endoftext|>; nSot of the first)
// through the decoder over window c and returns how the text follows the audio: for each of the
// inputs that predict the text tokens and the end token (nText+1 rows, nText = len(tokens)-nSot-2)
// and each of the first frames audio frames (20 ms) of the window, the alignment heads' mean
// cross-attention weight, standardised over the tokens and median-filtered along the frames:
// [nText+1, frames] row-major, higher where a token attends. frames is the length in audio frames
// of the part of the window that the text covers (at most AudioCtx; more is cut).
func (a *Aligner) Attention(tokens []int32, nSot int, c *Cross, frames int) ([]float64, error) {
	m := a.m
	n, T := len(tokens), m.TextState
	nText := n - nSot - 2
	if nText < 1 || n > m.TextCtx || frames < 1 {
		return nil, fmt.Errorf("whisper: nothing to align (%d tokens, %d frames)", n, frames)
	}
	frames = min(frames, m.AudioCtx)
	seq := a.dec.Pool().NewSeq(m.TextCtx)
	defer seq.Release()
	if err := seq.Reserve(n); err != nil {
		return nil, err
	}
	a.bb.Reset()
	if err := a.bb.Add(seq, n); err != nil {
		return nil, err
	}
	a.dec.captureQ = func(li int, q backend.Tensor) error {
		if !a.layer[li] {
			return nil
		}
		a.q[li] = slices.Grow(a.q[li][:0], n*T)[:n*T]
		return m.be.Read(q, 0, a.q[li])
	}
	err := a.dec.Forward(tokens, a.bb.Batch(), []*Cross{c}, nil, nil)
	a.dec.captureQ = nil
	if err != nil {
		return nil, err
	}

	// Weights of every alignment head: the attention itself (softmax over all the window's
	// AudioCtx frames, as the decoder attends) cut to the first frames, standardised over the
	// tokens, median-filtered along the frames; then their mean.
	hd := T / m.TextHead
	scale := 1 / math.Sqrt(float64(hd))
	mat := make([]float64, n*frames)
	w := make([]float64, n*frames)
	row := make([]float64, frames)
	dots := make([]float32, m.AudioCtx)
	kl := -1
	for _, h := range a.heads {
		if h.Layer != kl {
			if err := m.be.Copy(a.kf, c.k[h.Layer]); err != nil {
				return nil, err
			}
			if err := m.be.Read(a.kf, 0, a.k); err != nil {
				return nil, err
			}
			kl = h.Layer
		}
		crossWeights(w, dots, a.q[h.Layer], a.k, n, frames, T, h.Head*hd, hd, float32(scale))
		standardize(w, n, frames)
		for t := range n {
			medianFilter(row, w[t*frames:(t+1)*frames], 7)
			for f, v := range row {
				mat[t*frames+f] += v / float64(len(a.heads))
			}
		}
	}
	// Rows nSot .. n-2: the inputs that predict the text tokens and the end token.
	return mat[nSot*frames : (n-1)*frames], nil
}

// crossWeights writes to w ([n, frames]) one head's cross-attention weights: for each of the n
// queries (rows of q, [n, T]), the softmax of its scaled dot products with all len(dots) keys
// (rows of k, [len(dots), T]; the head's dims are off .. off+hd), of which the first frames are
// kept. dots is scratch.
func crossWeights(w []float64, dots, q, k []float32, n, frames, T, off, hd int, scale float32) {
	for t := range n {
		vec.Dots(dots, q[t*T+off:t*T+off+hd], k[off:], T)
		for f := range dots {
			dots[f] *= scale
		}
		// The softmax in float32 as the decoder's own (whisper.cpp's ggml_soft_max), the sum in
		// float64.
		mx, _ := vec.Max(dots)
		inv := 1 / vec.ExpSum(dots, mx)
		for f := range frames {
			w[t*frames+f] = float64(dots[f]) * inv
		}
	}
}

// standardize makes every column of x ([rows, cols]) zero-mean and divides it by
// sqrt(variance + normEpsAlign), the variance the population one over the rows (layer
// normalisation across the tokens, as whisper.cpp does it). Attention weights are small (about
// 1/AudioCtx where a head does not look), so the epsilon is not negligible: it damps the columns
// in which every token's weight is nearly the same.
func standardize(x []float64, rows, cols int) {
	for c := range cols {
		mean := 0.0
		for r := range rows {
			mean += x[r*cols+c]
		}
		mean /= float64(rows)
		v := 0.0
		for r := range rows {
			d := x[r*cols+c] - mean
			v += d * d
		}
		sd := math.Sqrt(v/float64(rows) + normEpsAlign)
		for r := range rows {
			x[r*cols+c] = (x[r*cols+c] - mean) / sd
		}
	}
}

// normEpsAlign is the epsilon of standardize.
const normEpsAlign = 1e-9

// medianFilter writes to dst the median of each width-wide neighbourhood of src (width odd),
// the edges reflected (…, x2, x1 | x0, x1, x2, …). A row no longer than width/2 is copied.
func medianFilter(dst, src []float64, width int) {
	n, pad := len(src), width/2
	if n <= pad {
		copy(dst, src)
		return
	}
	var buf [15]float64
	win := buf[:width]
	for i := range n {
		for k := range width {
			j := i + k - pad
			if j < 0 {
				j = -j
			} else if j >= n {
				j = 2*(n-1) - j
			}
			win[k] = src[j]
		}
		slices.Sort(win)
		dst[i] = win[pad]
	}
}
