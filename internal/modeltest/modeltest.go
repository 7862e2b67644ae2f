// Package modeltest holds what the model families' tests share: GGUF files rebuilt in memory
// with edits, and the check that recorded and replayed steps give the logits of steps run as
// called.
package modeltest

import (
	"bytes"
	"testing"

	"github.com/parleyhq/parley/runtime/gguf"
)

// Parse writes w into memory and parses the result.
func Parse(t testing.TB, w *gguf.Writer) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Rebuild copies f into a writer and parses the result, letting edit change metadata (called
// with ti nil, after the tensors) and drop (returning false) or replace (adding its own, then
// returning false) tensors. A nil edit copies f unchanged.
func Rebuild(t testing.TB, f *gguf.File, edit func(w *gguf.Writer, ti *gguf.TensorInfo) bool) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if edit != nil && !edit(w, ti) {
			continue
		}
		if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, f.TensorData(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(w, nil)
	}
	return Parse(t, w)
}
