package tests

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// TestSpeakBinary: the binary speaks a text with the random-weight Pocket TTS checkpoint, the
// reference's tokenizer and voice state and its recorded noise (t1-hello: EOS at step 14, 19
// frames), writing the reference's audio.wav within one step of 16-bit PCM, and as FLAC the same
// samples, and with --tts-decoder-threads (the decoder overlapped) the same samples; an unknown
// voice and flag mistakes get clear errors.
func TestSpeakBinary(t *testing.T) {
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	out := filepath.Join(t.TempDir(), "hello.wav")
	base := []string{"speak", "-m", weights, "--tokenizer", filepath.Join(ref, "tokenizer", "random-unigram-4000.model"), "-t", "2"}
	voice := filepath.Join(ref, "voice", "voice_state.safetensors")
	res := parley(t, "", append(base, "--voice", voice, "--noise", filepath.Join(ref, "t1-hello", "noise.npy"), "-o", out, "Hello world.")...)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(ref, "t1-hello", "audio.wav"))
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if len(got) != 44+2*19*1920 || string(got[:4]) != "RIFF" || le.Uint32(got[24:]) != 24000 || le.Uint16(got[22:]) != 1 || le.Uint16(got[34:]) != 16 {
		t.Fatalf("%d bytes, header %q; want a 16-bit mono 24 kHz WAV of 19 frames of 1920 samples", len(got), got[:min(44, len(got))])
	}
	if len(want) != len(got) {
		t.Fatalf("%d bytes, the reference's audio.wav %d", len(got), len(want))
	}
	for i := 44; i+1 < len(got); i += 2 {
		if d := int(int16(le.Uint16(got[i:]))) - int(int16(le.Uint16(want[i:]))); d < -1 || d > 1 {
			t.Fatalf("sample %d differs from the reference's by %d", (i-44)/2, d)
		}
	}
	// the same synthesis as FLAC: the same samples, losslessly
	flacOut := filepath.Join(t.TempDir(), "hello.flac")
	res = parley(t, "", append(base, "--voice", voice, "--noise", filepath.Join(ref, "t1-hello", "noise.npy"), "--format", "flac", "-o", flacOut, "Hello world.")...)
	if res.code != 0 {
		t.Fatalf("flac: exit %d: %s", res.code, res.stderr)
	}
	fl, err := os.ReadFile(flacOut)
	if err != nil {
		t.Fatal(err)
	}
	fromFLAC, info, err := audio.Decode(fl)
	if err != nil || info.Format != audio.FormatFLAC || info.SampleRate != 24000 || info.Frames != 19*1920 {
		t.Fatalf("the FLAC decodes as %+v: %v", info, err)
	}
	fromWAV, _, err := audio.Decode(got)
	if err != nil || len(fromWAV) != len(fromFLAC) {
		t.Fatalf("the WAV decodes to %d samples, the FLAC to %d: %v", len(fromWAV), len(fromFLAC), err)
	}
	for i := range fromWAV {
		if fromWAV[i] != fromFLAC[i] {
			t.Fatalf("sample %d: %v from the WAV, %v from the FLAC", i, fromWAV[i], fromFLAC[i])
		}
	}
	// with the Mimi decoder on a backend of its own, overlapping the FlowLM steps: the same
	// samples within one step
	overlapOut := filepath.Join(t.TempDir(), "overlap.wav")
	res = parley(t, "", append(base, "--voice", voice, "--noise", filepath.Join(ref, "t1-hello", "noise.npy"), "--tts-decoder-threads", "1", "-o", overlapOut, "Hello world.")...)
	if res.code != 0 {
		t.Fatalf("--tts-decoder-threads 1: exit %d: %s", res.code, res.stderr)
	}
	ov, err := os.ReadFile(overlapOut)
	if err != nil || len(ov) != len(got) {
		t.Fatalf("--tts-decoder-threads 1: %d bytes, %v; without it %d", len(ov), err, len(got))
	}
	for i := 44; i+1 < len(got); i += 2 {
		if d := int(int16(le.Uint16(got[i:]))) - int(int16(le.Uint16(ov[i:]))); d < -1 || d > 1 {
			t.Fatalf("--tts-decoder-threads 1: sample %d differs by %d", (i-44)/2, d)
		}
	}
	if res = parley(t, "", append(base, "--voice", voice, "--tts-decoder-threads", "-1", "-o", out, "Hi.")...); res.code != 2 || !strings.Contains(res.stderr, "--tts-decoder-threads") {
		t.Errorf("--tts-decoder-threads -1: exit %d, %s", res.code, res.stderr)
	}
	res = parley(t, "", append(base, "--voice", "nobody", "-o", out, "Hi.")...)
	if res.code != 1 || !strings.Contains(res.stderr, "no such voice") {
		t.Errorf("an unknown voice: exit %d, %s", res.code, res.stderr)
	}
	res = parley(t, "", append(base, "--voice", voice, "--format", "mp3", "-o", out, "Hi.")...)
	if res.code != 2 || !strings.Contains(res.stderr, "--format") {
		t.Errorf("an unsupported format: exit %d, %s", res.code, res.stderr)
	}
}

// TestServeSpeechBatched: three /v1/audio/speech requests at once on a server that batches
// three syntheses, its Mimi decoder on a backend of its own (--tts-decoder-threads), give, each,
// the WAV `parley speak` makes of the same text alone (the same voice, temperature and seed),
// within one step of 16-bit PCM.
func TestServeSpeechBatched(t *testing.T) {
	sameInBothBuilds(t)
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "model.safetensors")
	if err := os.Symlink(weights, model); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(ref, "tokenizer", "random-unigram-4000.model"), filepath.Join(dir, "tokenizer.model")); err != nil {
		t.Fatal(err)
	}
	voice := filepath.Join(ref, "voice", "voice_state.safetensors")
	texts := []string{"Hello world.", "One, two, three, four.", "Streaming speech starts early."}
	want := make([][]byte, len(texts))
	for i, text := range texts {
		out := filepath.Join(dir, fmt.Sprintf("%d.wav", i))
		if res := parley(t, "", "speak", "-m", model, "-t", "2", "--voice", voice, "-o", out, text); res.code != 0 {
			t.Fatalf("parley speak: exit %d, %s", res.code, res.stderr)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = b
	}
	post := func(base, text string) (int, []byte, error) {
		body := fmt.Sprintf(`{"model":"tts","input":%q,"voice":"ref","response_format":"wav"}`, text)
		resp, err := http.Post(base+"/v1/audio/speech", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	srv := startServer(t, "-t", "2", "-m", "tts="+model, "--tts-voice", "ref="+voice, "--tts-parallel", "3", "--tts-decoder-threads", "1")
	got := make([][]byte, len(texts))
	codes := make([]int, len(texts))
	errs := make([]error, len(texts))
	var wg sync.WaitGroup
	for i, text := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], got[i], errs[i] = post(srv.base, text)
		}()
	}
	wg.Wait()
	le := binary.LittleEndian
	for i := range texts {
		if errs[i] != nil || codes[i] != 200 {
			t.Fatalf("request %d: %d %v %.200s", i, codes[i], errs[i], got[i])
		}
		if len(got[i]) != len(want[i]) || len(got[i]) < 44 {
			t.Fatalf("request %d: %d bytes, parley speak %d", i, len(got[i]), len(want[i]))
		}
		for k := 44; k+1 < len(got[i]); k += 2 {
			if d := int(int16(le.Uint16(got[i][k:]))) - int(int16(le.Uint16(want[i][k:]))); d < -1 || d > 1 {
				t.Fatalf("request %d: sample %d differs from parley speak's by %d", i, (k-44)/2, d)
			}
		}
	}

}
