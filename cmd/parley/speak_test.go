package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// speakRef returns the random-weight checkpoint and the reference's tokenizer, voice state and
// directory (../shared/reference/tts).
func speakRef(t *testing.T) (weights, tok, voice, ref string) {
	t.Helper()
	ref = sharedtest.Path(t, "reference/tts")
	return sharedtest.PocketTTSRandomWeights(t), filepath.Join(ref, "tokenizer", "random-unigram-4000.model"),
		filepath.Join(ref, "voice", "voice_state.safetensors"), ref
}

func runCLI(stdin string, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(&env{strings.NewReader(stdin), &o, &e}, args)
	return code, o.String(), e.String()
}

// wavPCM checks a 16-bit mono 24 kHz WAV file's header and returns its samples.
func wavPCM(t *testing.T, b []byte) []int16 {
	t.Helper()
	le := binary.LittleEndian
	if len(b) < 44 || string(b[:4]) != "RIFF" || string(b[8:16]) != "WAVEfmt " || string(b[36:40]) != "data" {
		t.Fatalf("not a canonical WAV header: %q", b[:min(len(b), 44)])
	}
	if f, ch, rate, bits := le.Uint16(b[20:]), le.Uint16(b[22:]), le.Uint32(b[24:]), le.Uint16(b[34:]); f != 1 || ch != 1 || rate != 24000 || bits != 16 {
		t.Fatalf("format %d, %d channels, %d Hz, %d bits; want PCM mono 24000 Hz 16", f, ch, rate, bits)
	}
	n := le.Uint32(b[40:])
	if int(n) != len(b)-44 || le.Uint32(b[4:]) != 36+n {
		t.Fatalf("data of %d bytes in a file of %d", n, len(b))
	}
	pcm := make([]int16, n/2)
	for i := range pcm {
		pcm[i] = int16(le.Uint16(b[44+2*i:]))
	}
	return pcm
}

// TestSpeak: `parley speak` with the reference's voice state and recorded noise writes the
// reference's audio.wav (t1-hello: EOS at step 14, 19 frames), within one step of 16-bit PCM
// (the waveform agrees to about 1e-6; truncation can land either side).
func TestSpeak(t *testing.T) {
	weights, tok, voice, ref := speakRef(t)
	out := filepath.Join(t.TempDir(), "hello.wav")
	code, _, stderr := runCLI("", "speak", "-m", weights, "--tokenizer", tok, "--voice", voice, "-t", "2",
		"--noise", filepath.Join(ref, "t1-hello", "noise.npy"), "-o", out, "Hello world.")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	wantWAV, err := os.ReadFile(filepath.Join(ref, "t1-hello", "audio.wav"))
	if err != nil {
		t.Fatal(err)
	}
	got, want := wavPCM(t, b), wavPCM(t, wantWAV)
	if len(got) != 19*1920 || len(got) != len(want) {
		t.Fatalf("%d samples, want 19 frames of 1920 (the reference: %d)", len(got), len(want))
	}
	for i := range want {
		if d := int(got[i]) - int(want[i]); d < -1 || d > 1 {
			t.Fatalf("sample %d: %d, the reference's %d", i, got[i], want[i])
		}
	}
}

// TestSpeakStdio: text from standard input, raw PCM to standard output, temperature 0: no EOS
// comes for these weights, so the chunk's whole budget, 50 frames (4 s), is spoken.
func TestSpeakStdio(t *testing.T) {
	weights, tok, voice, _ := speakRef(t)
	code, stdout, stderr := runCLI("Hello world.\n", "speak", "-m", weights, "--tokenizer", tok, "--voice", voice, "-t", "2",
		"--temperature", "0", "--format", "pcm", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if len(stdout) != 2*50*1920 {
		t.Fatalf("%d bytes of PCM, want 50 frames of 1920 samples (4 s at 24 kHz)", len(stdout))
	}
}

// TestSpeakErrors: command-line mistakes exit 2 before any file is read; bad input exits 1 with
// a message that names the problem.
func TestSpeakErrors(t *testing.T) {
	for _, args := range [][]string{
		{"speak", "--voice", "v", "hi"},
		{"speak", "-m", "x", "hi"},
		{"speak", "-m", "x", "--voice", "v"},
		{"speak", "-m", "x", "--voice", "v", "a", "b"},
		{"speak", "-m", "x", "--voice", "v", "--format", "mp3", "hi"},
		{"speak", "-m", "x", "--voice", "v", "--temperature", "-1", "hi"},
		{"speak", "-m", "x", "--voice", "v", "--temperature", "NaN", "hi"},
		{"speak", "--no-such-flag", "hi"},
		{"speak", "-m", "x", "--voice", "v", "--backend", "nope", "hi"},
	} {
		if code, _, stderr := runCLI("", args...); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, stderr)
		}
	}
	dir := t.TempDir()
	garbage := filepath.Join(dir, "corrupt.safetensors")
	if err := os.WriteFile(garbage, []byte("this is not a checkpoint at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	notAudio := filepath.Join(dir, "prompt.wav")
	if err := os.WriteFile(notAudio, bytes.Repeat([]byte("text, not audio. "), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	weights, tok, voice, _ := speakRef(t)
	out := filepath.Join(dir, "out.wav")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-m", filepath.Join(dir, "missing.safetensors"), "--voice", voice, "hi"}, "missing.safetensors"},
		{[]string{"-m", garbage, "--voice", voice, "hi"}, "corrupt.safetensors"},
		{[]string{"-m", weights, "--voice", voice, "hi"}, "--tokenizer"},
		{[]string{"-m", weights, "--tokenizer", tok, "--voice", voice, "  \n "}, "empty"},
		{[]string{"-m", weights, "--tokenizer", tok, "--voice", "nobody", "hi"}, "no such voice"},
		{[]string{"-m", weights, "--tokenizer", tok, "--voice", notAudio, "hi"}, "prompt.wav"},
		{[]string{"-m", weights, "--tokenizer", tok, "--voice", voice, "--noise", voice, "hi"}, "--noise"},
	} {
		args := append([]string{"speak", "-t", "2", "-o", out}, c.args...)
		code, _, stderr := runCLI("", args...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, %q; want 1 and a message naming %q", c.args, code, stderr, c.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a failed synthesis wrote %s", out)
	}
}
