package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
)

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "8GiB": 8 << 30, "512MiB": 512 << 20, "1.5G": 3 << 29, "2 mb": 2e6, "64k": 64 << 10, "0": 0} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("%q: %d %v, want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "-1", "8XB", "GiB", "1e30"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("%q: accepted as %d", in, b)
		}
	}
}

func TestKeepAliveFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"5m": 5 * time.Minute, "300": 300 * time.Second, "0": 0, "-1": -time.Second, "-1s": -time.Second, "1.5": 1500 * time.Millisecond} {
		var k keepAliveFlag
		if err := k.Set(in); err != nil || time.Duration(k) != want {
			t.Errorf("%q: %v %v, want %v", in, time.Duration(k), err, want)
		}
	}
	var k keepAliveFlag
	if err := k.Set("soon"); err == nil {
		t.Errorf("\"soon\" accepted")
	}
}

// scanModelsDir lists model files by name, a split model once under its prefix, and leaves out
// other files and files that are not models.
func TestScanModelsDir(t *testing.T) {
	dir := t.TempDir()
	src := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	for _, n := range []string{"a.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf"} {
		if err := os.Symlink(src, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	for n, body := range map[string]string{"notes.txt": "x", "broken.gguf": "GGUF", ".hidden.gguf": "x"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	var warned []string
	got, err := scanModelsDir(dir, func(msg string, args ...any) { warned = append(warned, args[1].(string)) })
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range got {
		names = append(names, sp.name+"="+filepath.Base(sp.path))
	}
	if len(names) != 2 || names[0] != "a=a.gguf" || names[1] != "big=big-00001-of-00002.gguf" {
		t.Errorf("found %q", names)
	}
	if len(warned) != 1 || filepath.Base(warned[0]) != "broken.gguf" {
		t.Errorf("warned of %q, want broken.gguf", warned)
	}
}
