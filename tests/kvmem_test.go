package tests

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/gguf"
)

// TestServeKVFitsMemory: a model trained on 131072 positions, served with 64 sequences and no
// --ctx or --kv-mem, would want 131072 × 64 positions of KV cache (58 GB for the 15M shape's 6.9
// KB a position). serve cuts the cache to half of the memory available, says so, keeps the whole
// context (one sequence fits), and serves.
func TestServeKVFitsMemory(t *testing.T) {
	sameInBothBuilds(t)
	avail := memAvailable(t)
	long := synthContext(t, 131072)
	const perPos = 6 * 288 * 2 * 2 // layers × width × (k, v) × F16
	want := int64(131072) * 64 * perPos
	srv := startServer(t, "-m", "long="+long, "--parallel", "64", "-t", "2")
	log := srv.stderr.String()
	m := regexp.MustCompile(`msg="model loaded" model=long .* ctx=(\d+) kv_slots=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no model-loaded line:\n%s", log)
	}
	ctx, _ := strconv.Atoi(m[1])
	slots, _ := strconv.ParseInt(m[2], 10, 64)
	cut := strings.Contains(log, "KV cache cut to fit memory")
	switch {
	case ctx != 131072:
		t.Errorf("ctx %d: one sequence of 131072 positions (%d MiB) fits, and was not to be cut", ctx, 131072*perPos>>20)
	case want <= avail/2*9/10:
		t.Logf("this machine has %d MiB available: the whole cache fits (cut: %v)", avail>>20, cut)
	case !cut || slots*perPos > avail/2*11/10 || slots < 131072:
		t.Errorf("cut %v, %d slots (%d MiB) with %d MiB available; want the cache cut to about half of that", cut, slots, slots*perPos>>20, avail>>20)
	}
	if code, body, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"long","prompt":"Once upon a time","max_tokens":8}`); code != 200 {
		t.Errorf("completion: %d %s", code, body)
	}
}

// memAvailable returns MemAvailable of /proc/meminfo, skipping where there is none.
func memAvailable(t *testing.T) int64 {
	fh, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Skip("no /proc/meminfo: serve has no memory budget here")
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	t.Skip("no MemAvailable in /proc/meminfo")
	return 0
}

// synthContext writes a 15M-shape Q8_0 model whose metadata says it was trained on ctx positions.
func synthContext(t *testing.T, ctx uint32) string {
	t.Helper()
	dir := t.TempDir()
	small := filepath.Join(dir, "s.gguf")
	if res := parley(t, "", "synth", "--shape", "15M", "--type", "q8_0", "-o", small); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	long := filepath.Join(dir, "long.gguf")
	rewriteGGUF(t, small, long, func(w *gguf.Writer) { w.SetUint32("llama.context_length", ctx) })
	return long
}

// TestGenerateContextFitsMemory: generate without -c on a model trained on 2^24 positions (116
// GB of the 15M shape's cache) cuts its context to what half the memory available holds, says
// so on stderr, and generates; with -c it takes what it is given.
func TestGenerateContextFitsMemory(t *testing.T) {
	sameInBothBuilds(t)
	avail := memAvailable(t)
	const perPos = 6 * 288 * 2 * 2
	if int64(1<<24)*perPos <= avail/2 {
		t.Skipf("%d MiB available: the whole context fits here", avail>>20)
	}
	model := synthContext(t, 1<<24)
	res := parley(t, "", "generate", "-m", model, "-p", "Once upon a time", "-n", "8")
	if res.code != 0 || !strings.Contains(res.stderr, "context cut from the model's 16777216 positions") {
		t.Errorf("exit %d, stderr %s", res.code, res.stderr)
	}
	res = parley(t, "", "generate", "-m", model, "-p", "Once upon a time", "-n", "8", "-c", "64")
	if res.code != 0 || strings.Contains(res.stderr, "context cut") {
		t.Errorf("-c 64: exit %d, stderr %s", res.code, res.stderr)
	}
}
