package audio

import (
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkLogMel30s: the log-mel spectrogram of 30 s of audio (3000 transformed frames plus
// 3000 frames of appended silence), in ms per call and audio seconds per second.
func BenchmarkLogMel30s(b *testing.B) {
	f := randomFilters(80, 1)
	samples := testSignal(ChunkSamples, 1)
	for _, th := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("threads=%d", th), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := LogMel(samples, f, th); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(sec*1e3, "ms/op")
			b.ReportMetric(30/sec, "audio-s/s")
		})
	}
}

// BenchmarkDecodeWAV: 30 s of 16-bit PCM, as 16 kHz mono (no resampling) and as 44.1 kHz
// stereo (mixdown and resampling), in audio seconds decoded per second.
func BenchmarkDecodeWAV(b *testing.B) {
	for _, c := range []struct{ rate, ch int }{{16000, 1}, {44100, 2}, {48000, 1}} {
		pay := testMusic(c.rate, 30*c.rate)
		if c.ch == 1 {
			pay = toMono(pay)
		}
		wav := buildWAV(wavSpec{form: "RIFF", tag: wavePCM, channels: c.ch, rate: c.rate, width: 2}, pay)
		b.Run(fmt.Sprintf("%dHz-ch%d", c.rate, c.ch), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(wav)))
			for b.Loop() {
				if _, _, err := Decode(wav); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(30*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
		})
	}
}

// BenchmarkResample: one-shot conversion of 10 s of audio to 16 kHz, in input samples per
// second.
func BenchmarkResample(b *testing.B) {
	for _, in := range []int{8000, 22050, 44100, 48000, 44101} {
		x := testSignal(10*in, 1)
		b.Run(fmt.Sprint(in), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Resample(x, in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(x))*float64(b.N)/b.Elapsed().Seconds()/1e6, "Msamples/s")
			b.ReportMetric(10*float64(b.N)/b.Elapsed().Seconds(), "audio-s/s")
		})
	}
}
