package parakeet

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// refTags and refClips are the references of reference/asr-transducer: decodes of every clip
// for both tags, tensors for the first two clips.
var (
	refTags  = []string{"small-f32", "0.6b-v2-f32"}
	refClips = []string{"psx-cards-001", "jfk", "psx-cards-002", "ls-tc-1089-134686-0001", "ami-ES2011a-headset0-40s-46s",
		"psx-librivox-0870", "ljs-LJ001-0005", "ljs-LJ001-0014", "ls-dc-2412-153948-0000", "concat-40s"}
)

// refDecode is a decode/<tag>/<clip>.json reference.
type refDecode struct {
	Wav        string `json:"wav"`
	NSamples   int    `json:"n_samples"`
	NMelFrames int    `json:"n_mel_frames"`
	NEncFrames int    `json:"n_enc_frames"`
	BlankID    int32  `json:"blank_id"`
	Text       string `json:"text"`
	Segments   []struct {
		T0   int64  `json:"t0"`
		T1   int64  `json:"t1"`
		Text string `json:"text"`
	} `json:"segments"`
	Tokens []struct {
		ID        int32   `json:"id"`
		Piece     string  `json:"piece"`
		Frame     int     `json:"frame"`
		DurIdx    int     `json:"dur_idx"`
		DurVal    int     `json:"dur_val"`
		P         float64 `json:"p"`
		PLog      float64 `json:"plog"`
		T0        int64   `json:"t0"`
		T1        int64   `json:"t1"`
		WordStart bool    `json:"word_start"`
	} `json:"tokens"`
}

func readRef(t *testing.T, tag, clip string) *refDecode {
	t.Helper()
	p := sharedtest.Path(t, "reference/asr-transducer/decode/"+tag+"/"+clip+".json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var r refDecode
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// readWav decodes a clip the references name (paths relative to the shared directory).
func readWav(t *testing.T, rel string) []float32 {
	t.Helper()
	p := rel
	if rel == "audio/concat-40s.wav" || filepath.Base(rel) == "concat-40s.wav" {
		p = "reference/asr-transducer/audio/concat-40s.wav"
	}
	b, err := os.ReadFile(sharedtest.Path(t, p))
	if err != nil {
		t.Fatal(err)
	}
	s, info, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if info.SampleRate != SampleRate {
		t.Fatalf("%s: %d Hz", rel, info.SampleRate)
	}
	return s
}

// TestFrameCounts: mel and encoder frame counts of every reference clip.
func TestFrameCounts(t *testing.T) {
	for _, tag := range refTags {
		for _, clip := range refClips {
			r := readRef(t, tag, clip)
			if MelFrames(r.NSamples) != r.NMelFrames || EncoderFrames(r.NMelFrames) != r.NEncFrames {
				t.Errorf("%s/%s: %d samples: %d mel and %d encoder frames, recorded %d and %d", tag, clip, r.NSamples,
					MelFrames(r.NSamples), EncoderFrames(r.NMelFrames), r.NMelFrames, r.NEncFrames)
			}
		}
	}
}

// TestLogMel compares the front end with the normalised log-mel whisper.cpp fed its encoder
// (tensors/<tag>/<clip>/mel.npy), using the small model's window and filter bank (the 0.6b
// models have the same ones). Tolerance |Δ| ≤ 1e-3 (README §7: whisper.cpp's float32 FFT against
// float64 spectra); measured below about 4e-4.
func TestLogMel(t *testing.T) {
	f, err := Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fe, err := NewFrontEnd(f)
	if err != nil {
		t.Fatal(err)
	}
	var mel []float32
	for _, tag := range refTags {
		for _, clip := range refClips[:2] {
			r := readRef(t, tag, clip)
			samples := readWav(t, r.Wav)
			if len(samples) != r.NSamples {
				t.Fatalf("%s: %d samples, recorded %d", clip, len(samples), r.NSamples)
			}
			if mel, err = fe.LogMel(mel, samples); err != nil {
				t.Fatal(err)
			}
			want, err := npy.ReadFile(sharedtest.Path(t, "reference/asr-transducer/tensors/"+tag+"/"+clip+"/mel.npy"))
			if err != nil {
				t.Fatal(err)
			}
			rows, cols := want.Rows()
			if rows != r.NMelFrames || cols != fe.Mels() || len(mel) != len(want.Data) {
				t.Fatalf("%s/%s: %d values, reference [%d, %d]", tag, clip, len(mel), rows, cols)
			}
			var mx, ss float64
			for i, v := range mel {
				d := math.Abs(float64(v) - float64(want.Data[i]))
				mx = max(mx, d)
				ss += d * d
			}
			t.Logf("%s/%s: %d frames, max |Δ| %.3g, rms %.3g", tag, clip, rows, mx, math.Sqrt(ss/float64(len(mel))))
			if mx > 1e-3 {
				t.Errorf("%s/%s: max |Δ| %.3g, want ≤ 1e-3", tag, clip, mx)
			}
		}
	}
	if _, err := fe.LogMel(nil, make([]float32, MinSamples-1)); err == nil {
		t.Error("a clip shorter than two hops was accepted")
	}
	if _, err := fe.LogMel(nil, make([]float32, MinSamples)); err != nil {
		t.Errorf("two hops of silence: %v", err)
	}
}

// TestNormalizeHistory: a spectrogram cut in two, the statistics of its first frames given to
// Normalize as the history of the rest, is normalised as the whole clip is: the reference's
// frames within 1e-3 (as TestLogMel), LogMel's within 1e-5 (float64 statistics gathered in
// another order; float32 results). Without history it is LogMel's exactly.
func TestNormalizeHistory(t *testing.T) {
	f, err := Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fe, err := NewFrontEnd(f)
	if err != nil {
		t.Fatal(err)
	}
	tag, clip := refTags[0], refClips[1]
	samples := readWav(t, readRef(t, tag, clip).Wav)
	want, err := npy.ReadFile(sharedtest.Path(t, "reference/asr-transducer/tensors/"+tag+"/"+clip+"/mel.npy"))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := fe.LogMel(nil, samples)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fe.RawLogMel(nil, samples)
	if err != nil {
		t.Fatal(err)
	}
	nm, valid := fe.Mels(), len(samples)/HopLength
	st := fe.NewFeatureStats()
	for _, k := range []int{0, 1, 300, valid - 2, valid} {
		st.Reset()
		st.Add(raw[:k*nm])
		if st.Frames() != k {
			t.Fatalf("%d frames gathered, want %d", st.Frames(), k)
		}
		rest := append([]float32(nil), raw[k*nm:]...)
		fe.Normalize(rest, valid-k, st)
		tol := 1e-5
		if k == 0 {
			tol = 0
		}
		for i, v := range rest {
			if math.Abs(float64(v-whole[k*nm+i])) > tol || math.Abs(float64(v)-float64(want.Data[k*nm+i])) > 1e-3 {
				t.Fatalf("%d frames of history: value %d (frame %d) is %v, whole clip %v, reference %v",
					k, i, k+i/nm, v, whole[k*nm+i], want.Data[k*nm+i])
			}
		}
	}
}

// TestHannWindow: a file without a window gets whisper.cpp's periodic Hann of n_fft samples.
func TestHannWindow(t *testing.T) {
	f := synthFile(t, tinyHP, 8)
	f.Window = nil
	fe, err := NewFrontEnd(f)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range fe.window {
		want := 0.5 * (1 - math.Cos(2*math.Pi*float64(i)/64))
		if math.Abs(w-want) > 3e-7 { // the angle, its cosine and the result are rounded to float32
			t.Errorf("window[%d] = %v, want %v", i, w, want)
		}
	}
	f.Window = make([]float32, 48)
	f.Window[0], f.Window[47] = 1, 2
	if fe, err = NewFrontEnd(f); err != nil {
		t.Fatal(err)
	}
	if fe.window[8] != 1 || fe.window[55] != 2 || fe.window[7] != 0 || fe.window[56] != 0 {
		t.Error("the window is not centred in the frame")
	}
	f.Filters = f.Filters[:10]
	if _, err := NewFrontEnd(f); err == nil {
		t.Error("a short filter bank was accepted")
	}
}
