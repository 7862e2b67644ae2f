package cpu

import (
	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
)

// RelPosAttention is self-attention with relative positions within each clip (backend.Backend).
func (b *Backend) RelPosAttention(dst, q, k, v, p, u, bv backend.Tensor, a backend.RelPos, clips []int32) error {
	ts, err := b.ops.RelPosAttention(dst, q, k, v, p, u, bv, a, clips)
	if err != nil {
		return err
	}
	return b.ctx.RelPosAttention(ts[0].f32, ts[1].f32, ts[2].f32, ts[3].f32, ts[4].f32, ts[4].rows, ts[5].f32, ts[6].f32, clips,
		cpu.RelPos{NHead: a.NHead, HeadDim: a.HeadDim, Scale: a.Scale, Window: a.Window})
}
