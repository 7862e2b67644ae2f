package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

// Arbitrary bytes and lengths never panic: Dequantize and Quantize either fail cleanly or fill
// their outputs, and Dot returns a number (NaN for invalid lengths).
func FuzzFormats(f *testing.F) {
	f.Add(uint8(3), 64, []byte{1, 2, 3})
	f.Add(uint8(9), 256, make([]byte, 600))
	f.Fuzz(func(t *testing.T, ti uint8, n int, data []byte) {
		dt := allTypes[int(ti)%len(allTypes)]
		if n < -1000 || n > 1<<14 {
			return
		}
		fn := max(n, 0)
		out := make([]float32, fn)
		_ = Dequantize(dt, data, out)
		fl := make([]float32, len(data)/4)
		for i := range fl {
			fl[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		_ = Quantize(dt, fl, make([]byte, fn))
		if sz, err := dt.RowSize(int64(len(fl))); err == nil {
			_ = Quantize(dt, fl, make([]byte, sz))
		}
		if k, err := KernelFor(dt); err == nil {
			half := len(data) / 2
			_ = k.Dot(n, data[:half], data[half:])
			_ = k.Dot(n, data, data)
		}
	})
}
