package mapfile

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"
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

// TestReadInto: ReadInto copies a part of a mapped file from the file itself, and refuses what is
// not a part of Data or a destination of another length.
func TestReadInto(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	want := make([]byte, 3*pageSize+100)
	for i := range want {
		want[i] = byte(i*7 + i/251)
	}
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	part := f.Data[pageSize-3 : 2*pageSize+50]
	dst := make([]byte, len(part))
	if f.ReadInto(dst, part) {
		if string(dst) != string(want[pageSize-3:2*pageSize+50]) {
			t.Error("ReadInto read other bytes")
		}
	} else if f.fd != nil {
		t.Error("ReadInto failed on a mapped file")
	}
	if f.ReadInto(dst[1:], part) || f.ReadInto(make([]byte, 4), []byte("abcd")) {
		t.Error("ReadInto took a destination of another length, or bytes outside the file")
	}
}

// TestArena: Alloc returns zeroed, 64-byte aligned, disjoint slices, small and large ones, that
// stay writable until Free.
func TestArena(t *testing.T) {
	var a Arena
	var got [][]byte
	for _, n := range []int{1, 63, 64, 1000, arenaChunk / 2, 4096, arenaChunk, 5} {
		b, err := a.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != n || uintptr(unsafe.Pointer(&b[0]))%64 != 0 {
			t.Fatalf("Alloc(%d): %d bytes at %p", n, len(b), &b[0])
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("Alloc(%d): byte %d is %d", n, i, v)
			}
		}
		for i := range b {
			b[i] = byte(len(got) + 1)
		}
		got = append(got, b)
	}
	for i, b := range got {
		for _, v := range b {
			if v != byte(i+1) {
				t.Fatalf("allocation %d was overwritten", i)
			}
		}
	}
	if b, err := a.Alloc(0); b != nil || err != nil {
		t.Errorf("Alloc(0): %v, %v", b, err)
	}
	if err := a.Reserve(2*arenaChunk + 100); err != nil {
		t.Fatal(err)
	}
	maps := len(a.maps)
	for _, n := range []int{arenaChunk, 37, arenaChunk} { // all within the reservation
		b, err := a.Alloc(n)
		if err != nil || len(b) != n || uintptr(unsafe.Pointer(&b[0]))%64 != 0 {
			t.Fatalf("Alloc(%d) after Reserve: %d bytes, %v", n, len(b), err)
		}
	}
	if len(a.maps) != maps {
		t.Errorf("allocations within a reservation made %d more mappings", len(a.maps)-maps)
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
}
