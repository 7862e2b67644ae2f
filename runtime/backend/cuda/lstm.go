//go:build cuda && cgo && !nocgo

package cuda

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// LSTMCell: for each row of gates [n, 4P] in blocks [i, f, o, g], c = σ(f)·c + σ(i)·tanh(g) and
// h = σ(o)·tanh(c).
func (b *Backend) LSTMCell(h, c, gates backend.Tensor) error {
	ht, ct, gt, err := b.ops.LSTMCell(h, c, gates)
	if err != nil {
		return err
	}
	return b.ctx.LSTMCell(ht.ref(), ct.ref(), gt.ref(), gt.rows, ct.cols)
}
