package decode

import (
	"bytes"
	"compress/zlib"
	"math"
	"slices"
)

// Fallback holds the thresholds of temperature fallback as OpenAI's Whisper (transcribe.py,
// decode_with_fallback) and whisper.cpp (whisper_full_with_state) apply them to a decoded window.
// A hypothesis of more than 32 tokens whose last 32 have an entropy below Entropy is repetitive
// and fails (LowEntropy). The best hypothesis fails, and the window is decoded again at the next
// temperature, when no hypothesis finished, when it is unsure (average log-probability below
// LogProb while the no-speech probability is below NoSpeech), or when its text compresses better
// than CompressionRatio (Retry). A window whose no-speech probability is above NoSpeech with an
// average log-probability below LogProb is silence (Silent), whatever the temperature.
type Fallback struct {
	CompressionRatio float32 // 0: the compression ratio is not checked
	Entropy          float32
	LogProb          float32
	NoSpeech         float32
}

// LowEntropy reports whether a hypothesis of n tokens whose last 32 have the given entropy
// (TokenEntropy) is repetitive.
func (f Fallback) LowEntropy(n int, entropy float64) bool {
	return n > 32 && entropy < float64(f.Entropy)
}

// Unsure reports whether a result of average log-probability avgLogprob, in a window of
// no-speech probability noSpeech, is too unlikely to keep.
func (f Fallback) Unsure(avgLogprob float64, noSpeech float32) bool {
	return avgLogprob < float64(f.LogProb) && noSpeech < f.NoSpeech
}

// Silent reports whether a window of no-speech probability noSpeech whose result has average
// log-probability avgLogprob holds no speech: its text is dropped.
func (f Fallback) Silent(avgLogprob float64, noSpeech float32) bool {
	return noSpeech > f.NoSpeech && avgLogprob < float64(f.LogProb)
}

// Retry reports whether the best result of a window, decoded at a temperature that is not the
// last of the schedule, fails: failed (no hypothesis finished), Unsure, or more compressible than
// CompressionRatio. ratio gives the result's compression ratio (Compression.Ratio of its text);
// it is called only when that decides.
func (f Fallback) Retry(failed bool, avgLogprob float64, noSpeech float32, ratio func() float64) bool {
	if failed || f.Unsure(avgLogprob, noSpeech) {
		return true
	}
	return f.CompressionRatio > 0 && ratio() > float64(f.CompressionRatio)
}

// Temperatures appends the fallback schedule to dst: start, then start+inc, start+2·inc, ... (each
// the float32 sum of the one before and inc) while at most 1; with inc 0 (no fallback), start
// alone.
func Temperatures(dst []float32, start, inc float32) []float32 {
	if inc <= 0 {
		return append(dst, start)
	}
	for t := start; t < 1+1e-6; t += inc {
		dst = append(dst, t)
	}
	return dst
}

// TokenEntropy is the entropy in nats of the distribution of the values in ids (each value's
// share of them): whisper.cpp's measure of repetition over a hypothesis's last 32 tokens. It
// sorts ids in place.
func TokenEntropy(ids []int32) float64 {
	slices.Sort(ids)
	n := float64(len(ids))
	var ent float64
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && ids[j] == ids[i] {
			j++
		}
		q := float64(j-i) / n
		ent -= q * math.Log(q)
		i = j
	}
	return ent
}

// Compression measures repetition as OpenAI's Whisper does: a text's length in bytes over the
// length of its zlib compression. Its compressor (several hundred KiB of state) is made on first
// use and reset for every text. The zero value is ready to use; it is not safe for concurrent
// use.
type Compression struct {
	zw  *zlib.Writer
	buf bytes.Buffer
}

// Ratio is text's compression ratio; 0 for empty text.
func (c *Compression) Ratio(text string) float64 {
	if text == "" {
		return 0
	}
	c.buf.Reset()
	if c.zw == nil {
		c.zw = zlib.NewWriter(&c.buf)
	} else {
		c.zw.Reset(&c.buf)
	}
	c.zw.Write([]byte(text))
	c.zw.Close()
	return float64(len(text)) / float64(c.buf.Len())
}
