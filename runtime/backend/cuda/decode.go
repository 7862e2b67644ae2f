//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
)

// Sampling configures Sample: temperature (> 0), then the TopK largest logits (0: all; ties at
// the boundary all kept), then the smallest top set holding TopP of their probability (1: all).
type Sampling = bcuda.Sampling

// Argmax writes into ids the index of the largest logit of each row of logits [len(ids),
// vocab] F32 (the lowest index among equal maxima). Only the ids leave the device.
func (b *Backend) Argmax(logits *Tensor, ids []int32) error {
	const op = "argmax"
	l, err := b.f32Of(op, "logits", logits, false)
	if err != nil {
		return err
	}
	if l.rows != len(ids) {
		return fmt.Errorf("cuda: %s: %d ids for %d rows", op, len(ids), l.rows)
	}
	return b.ctx.Argmax(l.ref(), l.rows, l.cols, ids)
}

// Sample draws one id per row of logits [len(ids), vocab] F32 from softmax(logits/T) restricted
// as s says, row i from the uniform draw that seeds[i] determines (same seed, same logits: same
// id).
func (b *Backend) Sample(logits *Tensor, s Sampling, seeds []uint64, ids []int32) error {
	const op = "sample"
	l, err := b.f32Of(op, "logits", logits, false)
	if err != nil {
		return err
	}
	if l.rows != len(ids) || l.rows != len(seeds) {
		return fmt.Errorf("cuda: %s: %d ids and %d seeds for %d rows", op, len(ids), len(seeds), l.rows)
	}
	return b.ctx.Sample(l.ref(), l.rows, l.cols, s, seeds, ids)
}

// BeamStep is one step of beam search over logits [len(scores), vocab] F32, where scores are
// the beams' running sums of log-probabilities: the k = len(beam) best (beam, token) candidates
// by scores[b] + log_softmax(logits[b])[t] are written best first, with their new running score
// and that score divided by length^penalty (for comparing finished hypotheses of length tokens).
func (b *Backend) BeamStep(logits *Tensor, scores []float32, length int, penalty float32, beam, token []int32, score, norm []float32) error {
	const op = "beam step"
	l, err := b.f32Of(op, "logits", logits, false)
	if err != nil {
		return err
	}
	if l.rows != len(scores) {
		return fmt.Errorf("cuda: %s: %d scores for %d beams", op, len(scores), l.rows)
	}
	return b.ctx.BeamStep(l.ref(), l.cols, scores, length, penalty, beam, token, score, norm)
}
