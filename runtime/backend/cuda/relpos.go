//go:build cuda && cgo && !nocgo

package cuda

import (
	bcuda "github.com/parleyhq/parley/bindings/cuda"
	"github.com/parleyhq/parley/runtime/backend"
)

// RelPosAttention is self-attention with relative positions within each clip (backend.Backend).
// Heads of more than 1024 elements are refused with backend.ErrUnsupported.
func (b *Backend) RelPosAttention(dst, q, k, v, p, u, bv backend.Tensor, a backend.RelPos, clips []int32) error {
	ts, err := b.ops.RelPosAttention(dst, q, k, v, p, u, bv, a, clips)
	if err != nil {
		return err
	}
	return b.ctx.RelPosAttention(ts[0].ref(), ts[1].ref(), ts[2].ref(), ts[3].ref(), ts[4].ref(), ts[4].rows, ts[5].ref(), ts[6].ref(),
		clips, bcuda.RelPos{NHead: a.NHead, HeadDim: a.HeadDim, Scale: a.Scale, Window: a.Window})
}
