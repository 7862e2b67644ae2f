package gguf

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeSplit writes src as gguf-split does, in n files dir/prefix-0000i-of-0000n.gguf: the
// first with src's metadata, each with its share of the tensors and split.no and split.count.
func writeSplit(t *testing.T, src *File, dir, prefix string, n int) []string {
	t.Helper()
	var paths []string
	per := (len(src.Tensors) + n - 1) / n
	for i := range n {
		w := NewWriter()
		if i == 0 {
			for _, kv := range src.KVs {
				w.Set(kv.Key, kv.Value)
			}
			w.Set("split.tensors.count", Value{Type: Int32, V: int32(len(src.Tensors))})
		}
		w.Set("split.no", Value{Type: Uint16, V: uint16(i)})
		w.Set("split.count", Value{Type: Uint16, V: uint16(n)})
		for _, ti := range src.Tensors[min(i*per, len(src.Tensors)):min((i+1)*per, len(src.Tensors))] {
			if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, src.TensorData(&ti)); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(dir, fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, i+1, n))
		if err := w.WriteFile(p); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// TestSplit: a model written in three files opens from the first as the one file it was split
// from: its metadata, and every tensor's shape, type and bytes, found by name and in the table.
// Opening another file of the set, a missing or foreign file, a tensor in two files are errors.
func TestSplit(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	whole, err := Parse(buildFile(t, 3, everyValue(), makeTensors(r)))
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Tensors) < 3 {
		t.Fatalf("%d tensors; the test splits three ways", len(whole.Tensors))
	}
	dir := t.TempDir()
	paths := writeSplit(t, whole, dir, "m", 3)
	f, err := Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != len(whole.Tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(whole.Tensors))
	}
	for i, want := range whole.Tensors {
		got, ok := f.Tensor(want.Name)
		if !ok || got != &f.Tensors[i] || got.DType != want.DType || fmt.Sprint(got.Shape) != fmt.Sprint(want.Shape) {
			t.Fatalf("tensor %q: %+v, want %+v", want.Name, got, want)
		}
		if !bytes.Equal(f.TensorData(got), whole.TensorData(&want)) {
			t.Errorf("tensor %q: bytes differ", want.Name)
		}
	}
	for _, kv := range whole.KVs {
		if v, ok := f.Value(kv.Key); !ok || fmt.Sprint(v) != fmt.Sprint(kv.Value) {
			t.Errorf("%s: %v, want %v", kv.Key, v, kv.Value)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.TensorData(&f.Tensors[len(f.Tensors)-1]) != nil {
		t.Error("tensor data of a closed split file")
	}

	expectErr := func(path, says string) {
		t.Helper()
		if f, err := Open(path); err == nil {
			f.Close()
			t.Errorf("%s opened", path)
		} else if !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want it to say %q", path, err, says)
		}
	}
	expectErr(paths[1], "file 2 of 3 of a split model: open the first, m-00001-of-00003.gguf")

	// A missing file.
	other := t.TempDir()
	p := writeSplit(t, whole, other, "x", 3)
	os.Remove(p[2])
	expectErr(p[0], "file 3 of 3 of a split model")

	// A file of another set in its place.
	p = writeSplit(t, whole, t.TempDir(), "y", 3)
	q := writeSplit(t, whole, t.TempDir(), "y", 2)
	if err := os.Rename(q[1], p[1]); err != nil {
		t.Fatal(err)
	}
	expectErr(p[0], "split.no 1 and split.count 2, want 1 and 3")

	// A name that does not say its place.
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(renamed, b, 0o644); err != nil {
		t.Fatal(err)
	}
	expectErr(renamed, "not named PREFIX-00001-of-00003.gguf")

	// A tensor in two files.
	p = writeSplit(t, whole, t.TempDir(), "z", 2)
	w := NewWriter()
	w.Set("split.no", Value{Type: Uint16, V: uint16(1)})
	w.Set("split.count", Value{Type: Uint16, V: uint16(2)})
	ti := whole.Tensors[0]
	if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, whole.TensorData(&ti)); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(p[1]); err != nil {
		t.Fatal(err)
	}
	expectErr(p[0], "is in an earlier file of the split model too")
}
