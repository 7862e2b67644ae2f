package sharedtest

import (
	"bytes"
	"testing"

	"github.com/mewkiz/flac"
	"github.com/mewkiz/flac/frame"
	"github.com/mewkiz/flac/meta"
)

// SquareFLAC is sec seconds of a 16 kHz square wave at about 2 Hz and -30 dBFS, as FLAC: one
// constant subframe per 4096-sample frame, some 12 bytes, so that two hours are a 340 kB upload
// that decodes to 115 million samples (460 MB as float32). Admission and memory tests upload it.
func SquareFLAC(t testing.TB, sec int) []byte {
	t.Helper()
	const block = 4096
	n := sec * 16000
	var buf bytes.Buffer
	enc, err := flac.NewEncoder(&buf, &meta.StreamInfo{BlockSizeMin: 16, BlockSizeMax: block, SampleRate: 16000,
		NChannels: 1, BitsPerSample: 16, NSamples: uint64(n)})
	if err != nil {
		t.Fatal(err)
	}
	enc.EnablePredictionAnalysis(false)
	levels := [2][]int32{make([]int32, block), make([]int32, block)}
	for i := range block {
		levels[0][i], levels[1][i] = 1000, -1000
	}
	for k, off := 0, 0; off < n; k, off = k+1, off+block {
		bs := min(block, n-off)
		fr := &frame.Frame{Header: frame.Header{HasFixedBlockSize: true, BlockSize: uint16(bs), SampleRate: 16000,
			Channels: frame.ChannelsMono, BitsPerSample: 16},
			Subframes: []*frame.Subframe{{SubHeader: frame.SubHeader{Pred: frame.PredConstant}, Samples: levels[k%2][:bs], NSamples: bs}}}
		if err := enc.WriteFrame(fr); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
