package mapfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(f.Data) != "hello" {
		t.Fatalf("data %q", f.Data)
	}
	if err := f.Close(); err != nil || f.Data != nil {
		t.Fatalf("Close: %v, data %q", err, f.Data)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	e := filepath.Join(dir, "empty")
	os.WriteFile(e, nil, 0o644)
	if f, err := Open(e); err != nil || len(f.Data) != 0 {
		t.Fatalf("empty file: %v, %d bytes", err, len(f.Data))
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("a directory opened")
	}
	if _, err := Open(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestRelease: released pages read back with their contents; slices outside the file are ignored.
func TestRelease(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	want := make([]byte, 5*65536+123)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sum := 0
	for _, b := range f.Data {
		sum += int(b)
	}
	f.Release(f.Data[100 : len(f.Data)-100])
	f.Release(f.Data[:0])
	f.Release(make([]byte, 10)) // not part of the file
	for i := range want {
		if f.Data[i] != want[i] {
			t.Fatalf("byte %d after Release: %d, want %d", i, f.Data[i], want[i])
		}
	}
	_ = sum
}

func TestMagic(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		data string
		ok   bool
	}{{"GGUF\x03\x00", true}, {"lmgg", true}, {"abc", false}, {"", false}} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte(c.data), 0o644); err != nil {
			t.Fatal(err)
		}
		m, ok, err := Magic(p)
		if err != nil || ok != c.ok || (ok && string(m[:]) != c.data[:4]) {
			t.Errorf("%q: %q %v %v", c.data, m, ok, err)
		}
	}
	if _, _, err := Magic(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file gave no error")
	}
}
