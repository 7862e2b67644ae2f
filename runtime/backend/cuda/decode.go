//go:build cuda && cgo && !nocgo

package cuda

import (
	"fmt"

	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
)

var _ backend.Argmaxer = (*Backend)(nil)

// Argmax writes into ids[i] the index of the largest logit of row row0+i of logits F32 (the
// lowest index among equal maxima; -1 for a row with a NaN or +Inf or nothing above -Inf), as
// backend.Argmaxer says. Only the ids leave the device.
func (b *Backend) Argmax(logits backend.Tensor, row0 int, ids []int32) error {
	ref, cols, err := b.logitRows("argmax", logits, row0, len(ids))
	if err != nil || len(ids) == 0 {
		return err
	}
	return b.ctx.Argmax(ref, len(ids), cols, ids)
}

var _ backend.Drawer = (*Backend)(nil)

// Draw writes into ids[i] the token of row row0+i of logits F32 as draws[i] says
// (backend.Drawer): the argmax, or a draw from the row's top-k, top-p and min-p candidates. Only
// the ids leave the device.
func (b *Backend) Draw(logits backend.Tensor, row0 int, draws []backend.Draw, ids []int32) error {
	if len(draws) != len(ids) {
		return fmt.Errorf("cuda: draw: %d draws for %d ids", len(draws), len(ids))
	}
	ref, cols, err := b.logitRows("draw", logits, row0, len(ids))
	if err != nil || len(ids) == 0 {
		return err
	}
	return b.ctx.Draw(ref, len(ids), cols, draws, ids)
}

var _ backend.Chooser = (*Backend)(nil)

// Choose filters rows row0.. of logits F32 as choices says and writes each row's k most probable
// tokens after filtering (backend.Chooser: a speech decoder's suppression and timestamp rules).
// Only the chosen tokens, their log-probabilities and the rows' reports leave the device. Rows
// wider than bcuda.MaxChooseVocab are read and chosen on the host.
func (b *Backend) Choose(logits backend.Tensor, row0 int, choices []backend.Choice, drop []int32, k int, rows []backend.Chosen, ids []int32, logp []float32) error {
	ref, cols, err := b.logitRows("choose", logits, row0, len(choices))
	if err != nil {
		return err
	}
	if cols > bcuda.MaxChooseVocab {
		lg := make([]float32, len(choices)*cols)
		if err := b.Read(logits, row0, lg); err != nil {
			return err
		}
		return backend.ChooseRows(lg, cols, choices, drop, k, rows, ids, logp)
	}
	return b.ctx.Choose(ref, cols, choices, drop, k, rows, ids, logp)
}

// logitRows checks that logits is an F32 tensor of this backend with rows row0 .. row0+n-1, and
// returns the device memory of the first of them and the row length.
func (b *Backend) logitRows(op string, logits backend.Tensor, row0, n int) (bcuda.Ref, int, error) {
	l, err := b.ops.Logits(op, logits, row0, n)
	if err != nil {
		return bcuda.Ref{}, 0, err
	}
	ref := l.ref()
	ref.Off += row0 * l.rowBytes
	return ref, l.cols, nil
}

// BeamStep is one step of beam search over logits [len(scores), vocab] F32, where scores are
// the beams' running sums of log-probabilities: the k = len(beam) best (beam, token) candidates
// by scores[b] + log_softmax(logits[b])[t] are written best first, with their new running score
// and that score divided by length^penalty (for comparing finished hypotheses of length tokens).
func (b *Backend) BeamStep(logits *Tensor, scores []float32, length int, penalty float32, beam, token []int32, score, norm []float32) error {
	const op = "beam step"
	l, err := b.ops.F32(op, "logits", logits)
	if err != nil {
		return err
	}
	if l.rows != len(scores) {
		return fmt.Errorf("cuda: %s: %d scores for %d beams", op, len(scores), l.rows)
	}
	return b.ctx.BeamStep(l.ref(), l.cols, scores, length, penalty, beam, token, score, norm)
}
