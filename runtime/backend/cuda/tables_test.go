//go:build cuda && cgo && !nocgo

package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestTableArena: per-call tables (here GetRows' ids) equal to one uploaded earlier are reused,
// and when more distinct tables are queued than the table memory holds (500 distinct tables of
// 4 KiB here, against 1 MiB first allocated) it waits, starts over, and every result is still
// right, also for calls whose caller reused its ids slice at once, and for a table larger than
// the memory first allocated. The calls are queued behind long matrix products, so that the GPU
// lags far behind the host while the table memory fills and starts over.
func TestTableArena(t *testing.T) {
	b := openGPU(t)
	const rows, cols, n, calls, big = 64, 8, 1024, 1000, 300_000
	r := rand.New(rand.NewPCG(3, 4))
	alloc := func(rows, cols int) backend.Tensor {
		x, err := b.Alloc(tensor.F32, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		return x
	}
	tv := make([]float32, rows*cols)
	for i := range tv {
		tv[i] = float32(i)
	}
	table := alloc(rows, cols)
	if err := b.Write(table, 0, tv); err != nil {
		t.Fatal(err)
	}
	dsts := make([]backend.Tensor, calls+1)
	for c := range calls {
		dsts[c] = alloc(n, cols)
	}
	dsts[calls] = alloc(big, cols)
	k := 4096
	if emulated() {
		k = 32 // the emulation runs each product at once: there is no queue to fill
	}
	x, w, y := alloc(k, k), alloc(k, k), alloc(k, k)
	for range 40 { // about 5.5 TFLOP queued ahead of the tables
		if err := b.MatMul(y, x, w); err != nil {
			t.Fatal(err)
		}
	}
	same := make([]int32, n)
	for i := range same {
		same[i] = r.Int32N(rows)
	}
	passed := make([][]int32, calls+1) // what each call was given
	buf := make([]int32, n)            // one host slice that the other calls reuse at once
	for c := range calls {
		src := same // every other call repeats one table
		if c%2 == 1 {
			for i := range buf {
				buf[i] = r.Int32N(rows)
			}
			src = buf
		}
		passed[c] = append([]int32(nil), src...)
		if err := b.GetRows(dsts[c], table, src); err != nil {
			t.Fatal(err)
		}
	}
	passed[calls] = make([]int32, big)
	for i := range passed[calls] {
		passed[calls][i] = r.Int32N(rows)
	}
	if err := b.GetRows(dsts[calls], table, passed[calls]); err != nil {
		t.Fatal(err)
	}
	for c, d := range dsts {
		got := make([]float32, d.Rows()*cols)
		if err := b.Read(d, 0, got); err != nil {
			t.Fatal(err)
		}
		for i, id := range passed[c] {
			if got[i*cols] != tv[int(id)*cols] {
				t.Fatalf("call %d row %d: %v, want row %d (%v)", c, i, got[i*cols], id, tv[int(id)*cols])
			}
		}
	}
}
