package tests

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestSpeakBinary: the binary speaks a text with the random-weight Pocket TTS checkpoint, the
// reference's tokenizer and voice state and its recorded noise (t1-hello: EOS at step 14, 19
// frames), writing the reference's audio.wav within one step of 16-bit PCM; an unknown voice
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
	res = parley(t, "", append(base, "--voice", "nobody", "-o", out, "Hi.")...)
	if res.code != 1 || !strings.Contains(res.stderr, "no such voice") {
		t.Errorf("an unknown voice: exit %d, %s", res.code, res.stderr)
	}
	res = parley(t, "", append(base, "--voice", voice, "--format", "mp3", "-o", out, "Hi.")...)
	if res.code != 2 || !strings.Contains(res.stderr, "--format") {
		t.Errorf("an unsupported format: exit %d, %s", res.code, res.stderr)
	}
}
