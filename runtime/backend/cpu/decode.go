package cpu

import "github.com/parleyhq/parley/runtime/backend"

// The decoding the backend does where the logits are.

var _ backend.Argmaxer = (*Backend)(nil)

// Argmax writes into ids[i] the index of the largest value of row row0+i of an F32 tensor
// (backend.ArgmaxRows), without copying the rows out.
func (b *Backend) Argmax(logits backend.Tensor, row0 int, ids []int32) error {
	t, err := b.ops.Logits("argmax", logits, row0, len(ids))
	if err != nil {
		return err
	}
	return backend.ArgmaxRows(t.f32[row0*t.cols:(row0+len(ids))*t.cols], t.cols, ids)
}
