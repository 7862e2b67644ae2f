package purego

import (
	"github.com/parleyhq/parley/runtime/backend"
)

// LSTMCell: for each row of gates [n, 4P] in blocks [i, f, o, g], c = σ(f)·c + σ(i)·tanh(g) and
// h = σ(o)·tanh(c), in float32 (σ through vec.Expf, tanh in float64 rounded once). The rows of a
// prediction network's step are few and narrow: it runs on the calling goroutine.
func (be *Backend) LSTMCell(h, c, gates backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	ht, ct, gt, err := be.ops.LSTMCell(h, c, gates)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	p := ct.cols
	for r := 0; r < gt.rows; r++ {
		g := gt.f32[r*4*p : (r+1)*4*p]
		cr, hr := ct.f32[r*p:(r+1)*p], ht.f32[r*p:(r+1)*p]
		for k := range cr {
			in, fg, og := sigmoid(g[k]), sigmoid(g[p+k]), sigmoid(g[2*p+k])
			cr[k] = fg*cr[k] + in*tanh(g[3*p+k])
			hr[k] = og * tanh(cr[k])
		}
	}
	return nil
}
