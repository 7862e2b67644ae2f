package tests

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestCLILimits: sizes no context can hold are command-line mistakes (exit 2, one line), not
// a crash.
func TestCLILimits(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	for _, args := range [][]string{
		{"bench", "-m", model, "-p", "9223372036854775807", "-n", "1"},
		{"bench", "-m", model, "-p", "1000000000", "-n", "1"},
		{"bench", "-m", model, "-p", "0", "-n", "9223372036854775807"},
		{"generate", "-m", model, "-p", "Hi", "-c", "-5"},
		{"generate", "-m", model, "-p", "Hi", "-c", "9223372036854775807"},
		{"bench", "-m", sharedtest.WhisperRandomModel(t, "tiny.en"), "-n", "1000"}, // 448 positions
		{"serve", "-m", sharedtest.WhisperRandomModel(t, "tiny.en"), "--asr-beam", "0"},
		{"serve", "-m", sharedtest.WhisperRandomModel(t, "tiny.en"), "--asr-beam", "2", "--asr-best-of", "0"},
		{"generate", "-m", model, "-p", "Hi", "-t", "-1"},
	} {
		res := parley(t, "", args...)
		if res.code != 2 || strings.Contains(res.stderr, "goroutine") || !strings.Contains(res.stderr, "parley "+args[0]+":") {
			t.Errorf("%v: exit %d\n%s", args, res.code, res.stderr)
		}
	}
}

// TestGenerateInterrupted: Ctrl-C prints what was generated with stop "cancelled" and fails,
// in text and JSON alike.
func TestGenerateInterrupted(t *testing.T) {
	model := filepath.Join(t.TempDir(), "s15M.gguf")
	if res := parley(t, "", "synth", "--shape", "15M", "--type", "f32", "-o", model); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	// The text run is interrupted once its output shows it generating; the JSON run, which
	// prints nothing before the end, after three times as long as the text run took to get
	// there, and at least 1.5 s.
	var ready time.Duration
	for _, asJSON := range []bool{false, true} {
		args := []string{"generate", "-m", model, "-p", "Once upon a time", "-n", "0", "-c", "100000", "--ignore-eos", "--backend", "go", "-t", "1"}
		if asJSON {
			args = append(args, "--json")
		}
		cmd := exec.Command(parleyBin, args...)
		var out, errb bytes.Buffer
		cmd.Stderr = &errb
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		copied := make(chan error, 1)
		if asJSON {
			go func() { _, err := out.ReadFrom(stdout); copied <- err }()
			time.Sleep(max(3*ready, 1500*time.Millisecond))
		} else {
			// 20 bytes of text, read before anything else is: then out is the copier's alone.
			buf := make([]byte, 20)
			timer := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
			n, err := io.ReadFull(stdout, buf)
			timer.Stop()
			if err != nil {
				t.Fatalf("text run: %d bytes before %v\n%s", n, err, errb.String())
			}
			ready = time.Since(start)
			out.Write(buf)
			go func() { _, err := out.ReadFrom(stdout); copied <- err }()
		}
		cmd.Process.Signal(syscall.SIGINT)
		<-copied
		err = cmd.Wait()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 || !strings.Contains(errb.String(), "parley generate: interrupted") {
			t.Fatalf("json %v: %v\n%s", asJSON, err, errb.String())
		}
		if asJSON {
			var r struct {
				Tokens       []int32 `json:"tokens"`
				FinishReason string  `json:"finish_reason"`
			}
			if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.FinishReason != "cancelled" || len(r.Tokens) == 0 {
				t.Fatalf("JSON after the interrupt: %v %.300s", err, out.String())
			}
		} else if s := errb.String(); !strings.Contains(s, "stop: cancelled") || strings.Contains(s, "Inf") || out.Len() < 20 {
			t.Fatalf("text after the interrupt: %q\n%s", out.String(), s)
		}
	}
}

// TestThreadsFromEnvironment: -t defaults to $PARLEY_THREADS, as the other flags to theirs.
func TestThreadsFromEnvironment(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	cmd := exec.Command(parleyBin, "generate", "-m", model, "-p", "Hi", "-n", "2")
	cmd.Env = append(cmd.Environ(), "PARLEY_THREADS=-3")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "-t -3") {
		t.Fatalf("PARLEY_THREADS=-3: %v %s", err, out)
	}
}
