package parakeet

import (
	"errors"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// loopRows are the tensors of a decoding loop kept on the device (GreedyLoop, BeamLoop): each
// row's prediction-network state and joint prediction input, and a step's scratch.
type loopRows struct {
	h, c       []backend.Tensor // [rows, P] each layer's state of each row
	hNew, cNew []backend.Tensor // [rows, P] a step's new states
	pred, pNew backend.Tensor   // [rows, P] the joint's prediction input, kept and new
	x, gi, gh  backend.Tensor   // [rows, P], [rows, 4P] ×2
	eg, lg     backend.Tensor   // [rows, P], [rows, V+1+D]
	dummy      backend.Tensor   // [1, P] zeros: the encoder projection of a row with none
	owned      []backend.Tensor
}

// rowDecoding is what a loop's step asks of the decoding state kept on the device
// (backend.GreedyDecoding's and backend.BeamDecoding's operations of the same names).
type rowDecoding interface {
	Tokens(dst, table backend.Tensor) error
	Keep(dst, src backend.Tensor) error
	Frames(dst backend.Tensor, enc []backend.Tensor) error
}

// alloc makes the tensors of rows rows of m's loop; on an error those made are released.
func (r *loopRows) alloc(m *Model, rows int) error {
	h := m.HParams
	P := h.NPredDim
	var err error
	t := func(n, c int) backend.Tensor {
		if err != nil {
			return nil
		}
		var x backend.Tensor
		if x, err = m.be.Alloc(tensor.F32, n, c); err == nil {
			r.owned = append(r.owned, x)
		}
		return x
	}
	for range h.NPredLayers {
		r.h, r.c = append(r.h, t(rows, P)), append(r.c, t(rows, P))
		r.hNew, r.cNew = append(r.hNew, t(rows, P)), append(r.cNew, t(rows, P))
	}
	r.pred, r.pNew, r.x = t(rows, P), t(rows, P), t(rows, P)
	r.gi, r.gh = t(rows, 4*P), t(rows, 4*P)
	r.eg, r.lg = t(rows, P), t(rows, h.JointOutputs())
	r.dummy = t(1, P)
	if err != nil {
		r.close()
	}
	return err
}

// close releases the tensors.
func (r *loopRows) close() error {
	var errs []error
	for i := len(r.owned) - 1; i >= 0; i-- {
		errs = append(errs, r.owned[i].Close())
	}
	r.owned = nil
	return errors.Join(errs...)
}

// logits issues, for every row at once, the prediction network on the row's last decision
// (d.Tokens), keeping the new state only for the rows d keeps (d.Keep), then the joint at each
// row's frame (d.Frames of enc), into lg.
func (r *loopRows) logits(m *Model, d rowDecoding, enc []backend.Tensor) error {
	be := m.be
	if err := d.Tokens(r.x, m.embed); err != nil {
		return err
	}
	in := r.x
	for i, w := range m.lstm {
		if err := be.Copy(r.cNew[i], r.c[i]); err != nil {
			return err
		}
		if err := be.MatMul(r.gi, in, w.wih); err != nil {
			return err
		}
		if err := be.MatMul(r.gh, r.h[i], w.whh); err != nil {
			return err
		}
		if err := be.AddRows(r.gi, r.gi, r.gh); err != nil {
			return err
		}
		if err := be.AddRows(r.gi, r.gi, w.b); err != nil {
			return err
		}
		if err := be.LSTMCell(r.hNew[i], r.cNew[i], r.gi); err != nil {
			return err
		}
		in = r.hNew[i]
	}
	if err := be.MatMul(r.pNew, in, m.jPred); err != nil {
		return err
	}
	if err := be.AddRows(r.pNew, r.pNew, m.jPredB); err != nil {
		return err
	}
	for i := range r.h {
		if err := d.Keep(r.h[i], r.hNew[i]); err != nil {
			return err
		}
		if err := d.Keep(r.c[i], r.cNew[i]); err != nil {
			return err
		}
	}
	if err := d.Keep(r.pred, r.pNew); err != nil {
		return err
	}
	if err := d.Frames(r.eg, enc); err != nil {
		return err
	}
	if err := be.AddRows(r.eg, r.eg, r.pred); err != nil {
		return err
	}
	if err := be.Unary(r.eg, r.eg, tensor.ReLU); err != nil {
		return err
	}
	if err := be.MatMul(r.lg, r.eg, m.jOut); err != nil {
		return err
	}
	return be.AddRows(r.lg, r.lg, m.jOutB)
}
