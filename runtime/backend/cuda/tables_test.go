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
// right, also for calls whose caller reused its ids slice at once.
func TestTableArena(t *testing.T) {
	b := openGPU(t)
	const rows, cols, n, calls = 64, 8, 1024, 1000
	r := rand.New(rand.NewPCG(3, 4))
	tv := make([]float32, rows*cols)
	for i := range tv {
		tv[i] = float32(i)
	}
	table, err := b.Alloc(tensor.F32, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if err := b.Write(table, 0, tv); err != nil {
		t.Fatal(err)
	}
	same := make([]int32, n)
	for i := range same {
		same[i] = r.Int32N(rows)
	}
	passed := make([][]int32, calls) // what each call was given
	buf := make([]int32, n)          // one host slice that the other calls reuse at once
	dsts := make([]backend.Tensor, calls)
	for c := range calls {
		src := same // every other call repeats one table
		if c%2 == 1 {
			for i := range buf {
				buf[i] = r.Int32N(rows)
			}
			src = buf
		}
		passed[c] = append([]int32(nil), src...)
		if dsts[c], err = b.Alloc(tensor.F32, n, cols); err != nil {
			t.Fatal(err)
		}
		defer dsts[c].Close()
		if err := b.GetRows(dsts[c], table, src); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]float32, n*cols)
	for c := range calls {
		if err := b.Read(dsts[c], 0, got); err != nil {
			t.Fatal(err)
		}
		for i, id := range passed[c] {
			if got[i*cols] != tv[int(id)*cols] {
				t.Fatalf("call %d row %d: %v, want row %d (%v)", c, i, got[i*cols], id, tv[int(id)*cols])
			}
		}
	}
}
