package safetensors

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

// FuzzParse: any bytes parse or fail with ErrFormat, never panic; a file that parses has every
// tensor inside it, and writing its tensors again gives a file that parses to the same table.
func FuzzParse(f *testing.F) {
	f.Add(sample(f))
	f.Add(raw(`{}`, nil))
	f.Add(raw(`{"__metadata__":{"a":"b"},"x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(raw(`{"a":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, make([]byte, 3)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		w := NewWriter()
		for k, v := range file.Metadata {
			w.SetMetadata(k, v)
		}
		for i := range file.Tensors {
			tt := &file.Tensors[i]
			d := file.Data(tt)
			if int64(len(d)) != tt.Size {
				t.Fatalf("tensor %q: %d bytes, size %d", tt.Name, len(d), tt.Size)
			}
			if tt.Elements()*int64(tt.DType.Size()) != tt.Size {
				t.Fatalf("tensor %q: shape %v of %s is not %d bytes", tt.Name, tt.Shape, tt.DType, tt.Size)
			}
			if err := w.Add(tt.Name, tt.DType, tt.Shape, d); err != nil {
				t.Fatalf("rewriting %q: %v", tt.Name, err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("the rewritten file does not parse: %v", err)
		}
		if len(again.Tensors) != len(file.Tensors) || len(again.Metadata) != len(file.Metadata) {
			t.Fatalf("rewritten: %d tensors, %d metadata; had %d, %d", len(again.Tensors), len(again.Metadata), len(file.Tensors), len(file.Metadata))
		}
		for _, tt := range file.Tensors {
			u, ok := again.Tensor(tt.Name)
			if !ok || u.DType != tt.DType || !slices.Equal(u.Shape, tt.Shape) || !bytes.Equal(again.Data(u), file.Data(&tt)) {
				t.Fatalf("tensor %q changed in the rewrite", tt.Name)
			}
		}
	})
}
