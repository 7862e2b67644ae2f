package sharedtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// parakeetBytes are the sizes of the generator's files (reference/asr-transducer/README.md §2).
var parakeetBytes = map[string]int64{
	"small-f32":   28746685,
	"0.6b-v2-f32": 2471665113,
	"0.6b-v2-f16": 1237449433,
	"0.6b-v3-f32": 2508467548,
	"0.6b-v3-f16": 1255901788,
}

// ParakeetRandomModel returns the path of a random-weight Parakeet TDT model the transducer
// references were made with: shape "small", "0.6b-v2" or "0.6b-v3", F16 matrices or F32. The
// file is named as the references name it (parakeet-tdt-<shape>-random-s0-<f32|f16>.bin) and
// taken from $PARLEY_PARAKEET_MODELS when that directory holds it; otherwise it is regenerated,
// byte for byte, with models/asr/make_random_parakeet.py (python3 with numpy) into the system's
// temporary directory once and reused. The 0.6b files take 1.2 to 2.5 GB: they are generated
// only when $PARLEY_PARAKEET_LARGE is 1. t is skipped when the shared directory, python3 or
// numpy is absent, or a 0.6b file is wanted and not allowed.
func ParakeetRandomModel(t testing.TB, shape string, f16 bool) string {
	t.Helper()
	prec := "f32"
	if f16 {
		prec = "f16"
	}
	name := fmt.Sprintf("parakeet-tdt-%s-random-s0-%s.bin", shape, prec)
	if d := os.Getenv("PARLEY_PARAKEET_MODELS"); d != "" {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	script := Path(t, "models/asr/make_random_parakeet.py")
	if shape != "small" && os.Getenv("PARLEY_PARAKEET_LARGE") != "1" {
		t.Skipf("%s takes over 1 GB: set PARLEY_PARAKEET_LARGE=1 to generate it, or PARLEY_PARAKEET_MODELS to a directory that holds it", name)
	}
	dst := filepath.Join(os.TempDir(), "parley-"+name)
	parakeetGen.Lock()
	defer parakeetGen.Unlock()
	if fi, err := os.Stat(dst); err == nil {
		if want, ok := parakeetBytes[shape+"-"+prec]; !ok || fi.Size() == want {
			return dst
		}
	}
	py := pythonWithNumpy()
	if py == "" {
		t.Skip("no python3 with numpy: it is needed to regenerate the random-weight Parakeet models (apt-get install python3-numpy)")
	}
	tmp := fmt.Sprintf("%s.%d.tmp", dst, os.Getpid())
	args := []string{script, tmp, "--shape", shape}
	if f16 {
		args = append(args, "--f16")
	}
	out, err := exec.Command(py, args...).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		t.Fatalf("generating %s: %v\n%s", name, err, out)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

var parakeetGen sync.Mutex

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// pythonWithNumpy returns a python3 that imports numpy, or "".
func pythonWithNumpy() string {
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import numpy").Run() == nil {
			return p
		}
	}
	return ""
}
