package tests

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// pocketConvert converts the random-weight Pocket TTS checkpoint to GGUF with the reference's
// tokenizer and voice state (as "ref"), quantised to typ when it is not "".
func pocketConvert(t *testing.T, typ string) string {
	t.Helper()
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	out := filepath.Join(t.TempDir(), "pocket-"+typ+".gguf")
	args := []string{"convert", "-o", out, "--tokenizer", filepath.Join(ref, "tokenizer", "random-unigram-4000.model"),
		"--voice", "ref=" + filepath.Join(ref, "voice", "voice_state.safetensors")}
	if typ != "" {
		args = append(args, "--type", typ)
	}
	if res := parley(t, "", append(args, weights)...); res.code != 0 {
		t.Fatalf("convert %s: exit %d: %s", typ, res.code, res.stderr)
	}
	return out
}

// wavSamples reads a 16-bit mono WAV's samples.
func wavSamples(t *testing.T, path string) []int16 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 44 || string(b[:4]) != "RIFF" {
		t.Fatalf("%s: not a WAV (%d bytes)", path, len(b))
	}
	s := make([]int16, (len(b)-44)/2)
	for i := range s {
		s[i] = int16(binary.LittleEndian.Uint16(b[44+2*i:]))
	}
	return s
}

// TestConvertPocketTTS: `parley convert` writes the random-weight Pocket TTS safetensors
// checkpoint as GGUF with the tokenizer and a voice state embedded; `parley speak` with the
// GGUF file and the embedded voice's name writes exactly the samples it writes from the
// safetensors checkpoint, its tokenizer and the voice-state file (the reference's noise fixes
// the sampling). The Q8_0 file (the FlowLM transformer's, the flow head's and the Mimi decoder
// transformer's matrices quantised) stops at the same frame and its samples stay within qTolerance (RMS of the difference over RMS of the F32
// audio; Q8_0 keeps a matrix product within about 0.5% of F32's, and the FlowLM feeds back only
// through the 19 autoregressive frames here, so a few times that is allowed). Types the loader cannot take are usage errors.
func TestConvertPocketTTS(t *testing.T) {
	sameInBothBuilds(t)
	const qTolerance = 0.05
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	f32 := pocketConvert(t, "")
	q8 := pocketConvert(t, "q8_0")
	if fi, fq := fileSize(t, f32), fileSize(t, q8); fq >= fi*6/10 {
		t.Errorf("the Q8_0 file is %d bytes, the F32 one %d", fq, fi)
	}
	dir := t.TempDir()
	noise := filepath.Join(ref, "t1-hello", "noise.npy")
	speak := func(out string, args ...string) []int16 {
		t.Helper()
		args = append([]string{"speak", "-t", "2", "--noise", noise, "-o", filepath.Join(dir, out)}, args...)
		res := parley(t, "", append(args, "Hello world.")...)
		if res.code != 0 {
			t.Fatalf("speak %s: exit %d: %s", out, res.code, res.stderr)
		}
		return wavSamples(t, filepath.Join(dir, out))
	}
	want := speak("st.wav", "-m", weights, "--tokenizer", filepath.Join(ref, "tokenizer", "random-unigram-4000.model"),
		"--voice", filepath.Join(ref, "voice", "voice_state.safetensors"))
	got := speak("f32.wav", "-m", f32, "--voice", "ref")
	if len(got) != len(want) {
		t.Fatalf("F32 GGUF: %d samples, the safetensors checkpoint %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("F32 GGUF: sample %d is %d, the safetensors checkpoint's %d", i, got[i], want[i])
		}
	}
	q := speak("q8.wav", "-m", q8, "--voice", "ref")
	if len(q) != len(want) {
		t.Fatalf("Q8_0 GGUF: %d samples, F32 %d", len(q), len(want))
	}
	var diff, sig float64
	for i := range q {
		d := float64(q[i]) - float64(want[i])
		diff += d * d
		sig += float64(want[i]) * float64(want[i])
	}
	rel := math.Sqrt(diff / sig)
	t.Logf("Q8_0: relative RMS difference %.4f", rel)
	if sig == 0 || rel > qTolerance {
		t.Errorf("Q8_0 GGUF: relative RMS difference from F32 %.4f, tolerance %v", rel, qTolerance)
	}

	// Q4_K (the FlowLM transformer's matrices in Q4_K, the flow head's and the Mimi decoder
	// transformer's in Q8_0): its frame steps stay within 25% relative RMS of the reference
	// teacher-forced (runtime/models/pockettts TestQuantizedParity), but free running the
	// latents feed back, so the samples are not compared one by one: the synthesis ends within 20%
	// of F32's length, at a level (RMS) within 30% of F32's.
	q4 := pocketConvert(t, "q4_k")
	if f4, fq := fileSize(t, q4), fileSize(t, q8); f4 >= fq*85/100 {
		t.Errorf("the Q4_K file is %d bytes, the Q8_0 one %d", f4, fq)
	}
	q4s := speak("q4.wav", "-m", q4, "--voice", "ref")
	var s4 float64
	for _, v := range q4s {
		s4 += float64(v) * float64(v)
	}
	level := math.Sqrt(s4/float64(max(len(q4s), 1))) / math.Sqrt(sig/float64(len(want)))
	t.Logf("Q4_K: %d samples (F32 %d), level %.3f of F32's", len(q4s), len(want), level)
	if d := len(q4s) - len(want); d*5 > len(want) || -d*5 > len(want) || !(level > 0.7 && level < 1.3) {
		t.Errorf("Q4_K GGUF: %d samples, level %.3f of F32's; F32 %d samples", len(q4s), level, len(want))
	}

	for _, typ := range []string{"q5_k", "f16"} {
		res := parley(t, "", "convert", "--type", typ, "-o", filepath.Join(dir, "x.gguf"), f32)
		if res.code != 2 || !strings.Contains(res.stderr, "q8_0 or q4_k only") {
			t.Errorf("--type %s: exit %d: %s", typ, res.code, res.stderr)
		}
	}
	res := parley(t, "", "convert", "--voice", "nameless", "-o", filepath.Join(dir, "x.gguf"), f32)
	if res.code != 2 || !strings.Contains(res.stderr, "NAME=FILE") {
		t.Errorf("--voice without a name: exit %d: %s", res.code, res.stderr)
	}
}

// TestServeConvertedPocketTTS: `parley serve` speaks with a converted file's embedded voice the
// same WAV as it does with the safetensors checkpoint and the voice given by --tts-voice.
func TestServeConvertedPocketTTS(t *testing.T) {
	sameInBothBuilds(t)
	gg := pocketConvert(t, "")
	body := `{"model":"tts","input":"Hello world.","voice":"ref"}`
	srv := startServer(t, "-t", "2", "--api-key", speechKey, "-m", "tts="+gg)
	code, got, _ := speechPost(t, srv.base+"/v1/audio/speech", body)
	if code != 200 {
		t.Fatalf("GGUF: %d %.300s", code, got)
	}
	want := startSpeechServer(t)
	code, exp, _ := speechPost(t, want.base+"/v1/audio/speech", strings.Replace(body, `"ref"`, `"alba"`, 1))
	if code != 200 {
		t.Fatalf("safetensors: %d %.300s", code, exp)
	}
	if sha(got) != sha(exp) || len(got) < 44+3840 {
		t.Errorf("the GGUF file's WAV (%d bytes) differs from the safetensors checkpoint's (%d bytes)", len(got), len(exp))
	}
}

// TestConvertParakeet: `parley convert` writes the small random-weight Parakeet model as GGUF
// (and back as ggml, byte for byte the original), and `parley transcribe` of the GGUF file
// gives exactly the tokens and probabilities of the ggml file's; --type is a usage error.
func TestConvertParakeet(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	dir := t.TempDir()
	gg := filepath.Join(dir, "parakeet.gguf")
	if res := parley(t, "", "convert", "-o", gg, model); res.code != 0 {
		t.Fatalf("convert: exit %d: %s", res.code, res.stderr)
	}
	back := filepath.Join(dir, "parakeet.bin")
	if res := parley(t, "", "convert", "--format", "ggml", "-o", back, gg); res.code != 0 {
		t.Fatalf("convert back: exit %d: %s", res.code, res.stderr)
	}
	a, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("ggml → GGUF → ggml: %d bytes, the original %d, not the same", len(b), len(a))
	}
	wavs := []string{sharedtest.Path(t, "data/asr/wav/jfk.wav"), sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav")}
	var outs [2]string
	for i, m := range []string{model, gg} {
		res := parley(t, "", append([]string{"transcribe", "-t", "2", "-m", m, "--json"}, wavs...)...)
		if res.code != 0 {
			t.Fatalf("transcribe %s: exit %d: %s", m, res.code, res.stderr)
		}
		outs[i] = res.stdout
	}
	if outs[0] != outs[1] || !strings.Contains(outs[0], `"tokens":[{`) {
		t.Errorf("transcripts differ or have no tokens:\nggml: %.400s\nGGUF: %.400s", outs[0], outs[1])
	}
	if res := parley(t, "", "convert", "--type", "q8_0", "-o", filepath.Join(dir, "x.gguf"), model); res.code != 2 || !strings.Contains(res.stderr, "parakeet-quantize") {
		t.Errorf("--type q8_0: exit %d: %s", res.code, res.stderr)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
