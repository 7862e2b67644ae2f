package tensor

import (
	"fmt"
	"testing"
)

func TestFuncs(t *testing.T) {
	seen := map[string]bool{}
	for i, f := range Funcs() {
		if f != Func(i+1) || !f.Known() || seen[f.String()] {
			t.Fatalf("Funcs()[%d] = %v (%d): want value %d, known, with a name of its own", i, f, int32(f), i+1)
		}
		seen[f.String()] = true
	}
	for _, f := range []Func{0, -1, Func(len(Funcs()) + 1)} {
		if f.Known() || f.String() != fmt.Sprintf("func(%d)", int32(f)) {
			t.Fatalf("Func(%d): known %v, name %q", int32(f), f.Known(), f.String())
		}
	}
}
