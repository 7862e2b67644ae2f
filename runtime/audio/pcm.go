package audio

import "encoding/binary"

// PCM16ToFloat converts little-endian signed 16-bit samples (one channel, as a WebSocket
// client streams them) to float32 as s·2⁻¹⁵, the scaling whisper.cpp's reader uses. It converts
// min(len(dst), len(b)/2) samples and returns that count; an odd trailing byte is left for the
// caller to carry into the next frame.
func PCM16ToFloat(dst []float32, b []byte) int {
	n := min(len(dst), len(b)/2)
	b = b[:2*n]
	for i := range dst[:n] {
		dst[i] = float32(int16(binary.LittleEndian.Uint16(b[2*i:]))) * (1.0 / 32768)
	}
	return n
}
