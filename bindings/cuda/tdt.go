//go:build cuda && cgo && !nocgo

package cuda

// #include "parley_cuda.h"
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Greedy transducer decoding kept on the device (native/cuda/tdt.cu): the state layout is
// parley_cuda.h's.

// TDT state fields (PLC_TDT_*).
const (
	TDTFrame  = C.PLC_TDT_FRAME
	TDTRun    = C.PLC_TDT_RUN
	TDTEnd    = C.PLC_TDT_END
	TDTDone   = C.PLC_TDT_DONE
	TDTEmit   = C.PLC_TDT_EMIT
	TDTTok    = C.PLC_TDT_TOK
	TDTIdx    = C.PLC_TDT_IDX
	TDTCount  = C.PLC_TDT_COUNT
	TDTBad    = C.PLC_TDT_BAD
	TDTFields = C.PLC_TDT_FIELDS
	// TDTMaxDurations is the most duration logits a rule may have.
	TDTMaxDurations = C.PLC_TDT_MAX_DURATIONS
)

// TDTRule is the greedy rule of TDTDecide.
type TDTRule struct {
	NTok, MaxSymbols, Ring int // token logits (the blank last); zero-duration tokens per frame; ring entries per row
	Durations              []int
}

// TDTStateBytes is the size of the state of n rows with rings of ring tokens.
func TDTStateBytes(n, ring int) int { return mul(4, n, TDTFields+5*ring) }

// TDTStart restarts row of the state st of n rows at frame frame of a clip of end frames, with
// tok the last token decided and the prediction network to take it when emit is set (a clip's
// start: frame 0, the blank, emit).
func (c *Context) TDTStart(st Ref, n, ring, row, frame, end int, tok int32, emit bool) error {
	const op = "tdt start"
	if row < 0 || row >= n || frame < 0 || frame > 1<<30 || end < 0 || end > 1<<30 || tok < 0 {
		return fmt.Errorf("cuda: %s: row %d of %d, frame %d of %d, token %d", op, row, n, frame, end, tok)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	sp, err := st.at(c, op, "state", TDTStateBytes(n, ring))
	if err != nil {
		return err
	}
	e := C.int32_t(0)
	if emit {
		e = 1
	}
	return c.status(op, C.plc_tdt_start(c.c, (*C.int32_t)(sp), C.int64_t(n), C.int64_t(row), C.int32_t(frame), C.int32_t(end), C.int32_t(tok), e))
}

// TDTDecide applies rule r to the n rows of logits [n, NTok+len(Durations)] F32.
func (c *Context) TDTDecide(logits Ref, n int, r TDTRule, st Ref) error {
	const op = "tdt decide"
	if len(r.Durations) > TDTMaxDurations || n < 0 || n > 65535 || r.NTok < 1 || r.MaxSymbols < 1 || r.Ring < 1 || r.Ring > 1<<20 {
		return fmt.Errorf("cuda: %s: %d rows, rule %+v", op, n, r)
	}
	cfg := C.plc_tdt_cfg{n_tok: C.int32_t(r.NTok), n_dur: C.int32_t(len(r.Durations)), max_symbols: C.int32_t(r.MaxSymbols), ring: C.int32_t(r.Ring)}
	for i, d := range r.Durations {
		if d < 0 || d > 1<<30 {
			return fmt.Errorf("cuda: %s: duration %d is %d", op, i, d)
		}
		cfg.durations[i] = C.int32_t(d)
	}
	width := r.NTok + len(r.Durations)
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	lp, err := logits.at(c, op, "logits", mul(n, width, 4))
	if err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTStateBytes(n, r.Ring))
	if err != nil {
		return err
	}
	c.tdtArg = cfg
	return c.status(op, C.plc_tdt_decide(c.c, fp(lp), C.int64_t(n), C.int64_t(width), &c.tdtArg, (*C.int32_t)(sp)))
}

// TDTGather: dst[i,:] = table[field i of st,:] for the n rows of dst [n, cols] F32, field TDTIdx
// or TDTTok; with tables (n refs, each rows[i] rows of cols F32) row i reads tables[i]. table is
// F32 or F16 of rows rows.
func (c *Context) TDTGather(dst Ref, tables []Ref, tableRows []int, table Ref, dt tensor.DType, rows, cols int, st Ref, n, ring, field int) error {
	const op = "tdt gather"
	if (field != TDTIdx && field != TDTTok) || n < 0 || n > 65535 || cols < 0 || (tables != nil && (len(tables) != n || len(tableRows) != n)) {
		return fmt.Errorf("cuda: %s: %d rows of %d, field %d", op, n, cols, field)
	}
	if dt != tensor.F32 && dt != tensor.F16 || tables != nil && dt != tensor.F32 {
		return fmt.Errorf("cuda: %s: table of %v: %w", op, dt, tensor.ErrUnsupported)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, cols, 4))
	if err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTStateBytes(n, ring))
	if err != nil {
		return err
	}
	var tp unsafe.Pointer
	var tps *unsafe.Pointer
	if tables != nil {
		if cap(c.tdtTables) < n {
			c.tdtTables = make([]uintptr, n)
		}
		c.tdtTables = c.tdtTables[:n]
		for i, t := range tables {
			p, err := t.at(c, op, "table", mul(max(tableRows[i], 1), cols, 4))
			if err != nil {
				return err
			}
			c.tdtTables[i] = uintptr(p)
		}
		if n > 0 {
			tps = (*unsafe.Pointer)(unsafe.Pointer(&c.tdtTables[0]))
		}
	} else if tp, err = table.at(c, op, "table", mul(rows, elemSize(dt, cols))); err != nil {
		return err
	}
	return c.status(op, C.plc_tdt_gather(c.c, fp(dp), tps, tp, C.int32_t(dt), C.int64_t(cols), (*C.int32_t)(sp), C.int64_t(n), C.int32_t(field)))
}

// TDTKeep: dst[i,:] = src[i,:] for each of the n rows of [n, cols] F32 whose emit flag is set
// in st.
func (c *Context) TDTKeep(dst, src Ref, cols int, st Ref, n, ring int) error {
	const op = "tdt keep"
	if n < 0 || n > 65535 || cols < 0 {
		return fmt.Errorf("cuda: %s: %d rows of %d", op, n, cols)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, cols, 4))
	if err != nil {
		return err
	}
	sp2, err := src.at(c, op, "src", mul(n, cols, 4))
	if err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTStateBytes(n, ring))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_tdt_keep(c.c, fp(dp), fp(sp2), C.int64_t(cols), (*C.int32_t)(sp), C.int64_t(n)))
}

// Downloads is how many times the context has copied device memory to the host.
func (c *Context) Downloads() (int64, error) {
	if err := c.lock("downloads"); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	var n C.int64_t
	if err := c.status("downloads", C.plc_ctx_downloads(c.c, &n)); err != nil {
		return 0, err
	}
	return int64(n), nil
}
