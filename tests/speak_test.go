package tests

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// TestSpeakBinary: the binary speaks a text with the random-weight Pocket TTS checkpoint, the
// reference's tokenizer and voice state and its recorded noise (t1-hello: EOS at step 14, 19
// frames), writing the reference's audio.wav within one step of 16-bit PCM, and as FLAC the same
// samples; an unknown voice
// and a flag mistake get clear errors.
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
	res = parley(t, "", append(base, "--voice", "nobody", "-o", out, "Hi.")...)
	if res.code != 1 || !strings.Contains(res.stderr, "no such voice") {
		t.Errorf("an unknown voice: exit %d, %s", res.code, res.stderr)
	}
	res = parley(t, "", append(base, "--voice", voice, "--format", "mp3", "-o", out, "Hi.")...)
	if res.code != 2 || !strings.Contains(res.stderr, "--format") {
		t.Errorf("an unsupported format: exit %d, %s", res.code, res.stderr)
	}
}
