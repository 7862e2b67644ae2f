// Package sharedtest locates the reference material that tests compare against: the directory
// "shared" beside the repository root (real models, llama.cpp reference outputs). Tests that need
// it skip, saying why, when it is absent. It also makes inputs too large to keep (SquareFLAC).
package sharedtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Dir returns the shared directory, or skips t if there is none. $PARLEY_SHARED overrides the
// location.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("PARLEY_SHARED"); d != "" {
		return d
	}
	d, ok := find()
	if !ok {
		t.Skip("reference directory ../shared (beside the repository root) is absent; set PARLEY_SHARED to run this test")
	}
	return d
}

// Lookup returns the shared directory ($PARLEY_SHARED, or "shared" beside the repository root),
// or "" if there is none, for tests that use it when present and do not skip without it (fuzz
// seeds).
func Lookup() string {
	if d := os.Getenv("PARLEY_SHARED"); d != "" {
		return d
	}
	d, _ := find()
	return d
}

// Path returns a file under the shared directory, skipping t if it does not exist.
func Path(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(Dir(t), filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Skipf("reference file %s is absent: %v", p, err)
	}
	return p
}

func find() (string, bool) {
	wd, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for d := wd; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			s := filepath.Join(filepath.Dir(d), "shared")
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				return s, true
			}
			return "", false
		}
		p := filepath.Dir(d)
		if p == d {
			return "", false
		}
		d = p
	}
}

// WhisperRandomModel returns the path of the random-weight Whisper model that the ASR references
// were made with ("tiny.en", "tiny" or "base.en"), regenerating it byte for byte from the
// vocabulary-only file in models/asr with the generator script there (python3 with numpy). The
// file is written once into the system's temporary directory and reused. t is skipped when the
// shared directory, python3 or numpy is absent.
func WhisperRandomModel(t testing.TB, name string) string {
	t.Helper()
	src := Path(t, "models/asr/for-tests-ggml-"+name+".bin")
	script := Path(t, "models/asr/make_random_ggml.py")
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import numpy").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("no python3 with numpy: it is needed to regenerate the random-weight Whisper models (apt-get install python3-numpy)")
	}
	dst := filepath.Join(os.TempDir(), "parley-ggml-"+name+"-RANDOM.bin")
	whisperGen.Lock()
	defer whisperGen.Unlock()
	if fi, err := os.Stat(dst); err == nil && fi.Size() > 1<<20 {
		return dst
	}
	tmp := fmt.Sprintf("%s.%d.tmp", dst, os.Getpid())
	out, err := exec.Command(py, script, src, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		t.Fatalf("regenerating %s: %v\n%s", name, err, out)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

var whisperGen sync.Mutex

// PocketTTSRandomWeightsSize is the size of the random-weight Pocket TTS checkpoint that
// reference/tts/make_random.py writes.
const PocketTTSRandomWeightsSize = 438033488

// PocketTTSRandomWeights returns the path of the random-weight Pocket TTS checkpoint (a
// TTSModel.state_dict() safetensors file) that the references in reference/tts were made with:
// $PARLEY_POCKETTTS_WEIGHTS if set, else the file regenerated once into the system's temporary
// directory by reference/tts/make_random.py (python3 with numpy, byte-identical everywhere) and
// reused. t is skipped when the shared directory, python3 or numpy is absent.
func PocketTTSRandomWeights(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PARLEY_POCKETTTS_WEIGHTS"); p != "" {
		return p
	}
	script := Path(t, "reference/tts/make_random.py")
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import numpy").Run() == nil {
			py = p
			break
		}
	}
	dst := filepath.Join(os.TempDir(), "pocket-tts-RANDOM.safetensors")
	pocketGen.Lock()
	defer pocketGen.Unlock()
	if fi, err := os.Stat(dst); err == nil && fi.Size() == PocketTTSRandomWeightsSize {
		return dst
	}
	if py == "" {
		t.Skip("no python3 with numpy: it is needed to regenerate the random-weight Pocket TTS checkpoint (apt-get install python3-numpy), or set PARLEY_POCKETTTS_WEIGHTS")
	}
	tmp := fmt.Sprintf("%s.%d.tmp", dst, os.Getpid())
	out, err := exec.Command(py, script, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		t.Fatalf("regenerating the Pocket TTS checkpoint: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

var pocketGen sync.Mutex
