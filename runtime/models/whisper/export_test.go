package whisper

import (
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// RaceEnabled tells the external tests whether the race detector is on.
const RaceEnabled = raceEnabled

// LoadWAV reads a shared recording as 16 kHz samples (the internal tests' helper).
var LoadWAV = testWAV

// CrossValues reads a window's cross-attention keys and values, every decoder layer's, as float32.
func CrossValues(m *Model, c *Cross) ([]float32, error) {
	t, err := m.be.Alloc(tensor.F32, m.AudioCtx, m.TextState)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	var out []float32
	for _, src := range append(append([]backend.Tensor(nil), c.k...), c.v...) {
		if err := m.be.Copy(t, src); err != nil {
			return nil, err
		}
		buf := make([]float32, m.AudioCtx*m.TextState)
		if err := m.be.Read(t, 0, buf); err != nil {
			return nil, err
		}
		out = append(out, buf...)
	}
	return out, nil
}
