//go:build cuda && cgo && !nocgo

package cuda

// #include "parley_cuda.h"
import "C"

import (
	"fmt"
	"math"
)

// A transducer beam search kept on the device (native/cuda/tdtbeam.cu): the state layout is
// parley_cuda.h's.

// TDT beam state fields (PLC_TDTB_*).
const (
	TDTBHFrame   = C.PLC_TDTB_HFRAME
	TDTBHRun     = C.PLC_TDTB_HRUN
	TDTBHNode    = C.PLC_TDTB_HNODE
	TDTBHNTok    = C.PLC_TDTB_HNTOK
	TDTBHPred    = C.PLC_TDTB_HPRED
	TDTBHTok     = C.PLC_TDTB_HTOK
	TDTBHIdx     = C.PLC_TDTB_HIDX
	TDTBHParent  = C.PLC_TDTB_HPARENT
	TDTBHFields  = C.PLC_TDTB_HFIELDS
	TDTBSEnd     = C.PLC_TDTB_SEND
	TDTBSDone    = C.PLC_TDTB_SDONE
	TDTBSBad     = C.PLC_TDTB_SBAD
	TDTBSNHyp    = C.PLC_TDTB_SNHYP
	TDTBSNodes   = C.PLC_TDTB_SNODES
	TDTBSRounds  = C.PLC_TDTB_SROUNDS
	TDTBSWidth   = C.PLC_TDTB_SWIDTH
	TDTBSFields  = C.PLC_TDTB_SFIELDS
	TDTBNodeSize = 4 * C.PLC_TDTB_NODE_WORDS
	// TDTBMaxWidth is the widest beam.
	TDTBMaxWidth = C.PLC_TDTB_MAX_WIDTH
)

// TDTBeam is the search of a beam state: the greedy rule's logits, durations and max-symbols
// rule, the width, the merge rule and the nodes of each stream's token pool.
type TDTBeam struct {
	NTok, MaxSymbols, Width, Cap int
	LogSumExp                    bool
	Durations                    []int
}

// TDTBeamLayout gives the byte offsets in a state of n streams of width w: the hypothesis
// fields, the stream fields and the node pools.
func TDTBeamLayout(n, w int) (hyp, stream, nodes int) {
	rows := n * w
	hyp = 16 * rows
	stream = hyp + 4*TDTBHFields*rows
	nodes = stream + 4*TDTBSFields*n
	return
}

// TDTBeamStateBytes is the size of the state of n streams of search b.
func TDTBeamStateBytes(n int, b TDTBeam) int {
	_, _, nodes := TDTBeamLayout(n, b.Width)
	p := mul(n, b.Cap, TDTBNodeSize)
	if p < 0 || nodes > math.MaxInt-p {
		return -1
	}
	return nodes + p
}

// cfg checks b and fills the context's argument copy.
func (c *Context) tdtbCfg(op string, n int, b TDTBeam) error {
	if len(b.Durations) > TDTMaxDurations || n < 0 || n > 65535 || b.Width < 1 || b.Width > TDTBMaxWidth || n*b.Width > 65535 ||
		b.NTok < 1 || b.MaxSymbols < 1 || b.Cap < 1 || b.Cap > 1<<26 {
		return fmt.Errorf("cuda: %s: %d streams, search %+v", op, n, b)
	}
	cfg := C.plc_tdtb_cfg{n_tok: C.int32_t(b.NTok), n_dur: C.int32_t(len(b.Durations)), max_symbols: C.int32_t(min(b.MaxSymbols, math.MaxInt32)),
		width: C.int32_t(b.Width), cap: C.int32_t(b.Cap)}
	if b.LogSumExp {
		cfg.lse = 1
	}
	for i, d := range b.Durations {
		if d < 0 || d > 1<<30 {
			return fmt.Errorf("cuda: %s: duration %d is %d", op, i, d)
		}
		cfg.durations[i] = C.int32_t(d)
	}
	c.tdtbArg = cfg
	return nil
}

// TDTBeamStart restarts stream s of the state st of n streams at frame 0 of a clip of end
// frames, with a beam of width hypotheses (1 to b.Width).
func (c *Context) TDTBeamStart(st Ref, n int, b TDTBeam, s, end, width int, blank int32) error {
	const op = "tdt beam start"
	if s < 0 || s >= n || end < 0 || end > 1<<30 || blank < 0 || width < 1 || width > b.Width {
		return fmt.Errorf("cuda: %s: stream %d of %d, %d frames, width %d, blank %d", op, s, n, end, width, blank)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.tdtbCfg(op, n, b); err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTBeamStateBytes(n, b))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_tdtb_start(c.c, sp, C.int64_t(n), &c.tdtbArg, C.int64_t(s), C.int32_t(end), C.int32_t(width), C.int32_t(blank)))
}

// TDTBeamRound makes one round of the search for the n streams of st, whose n*Width hypothesis
// rows have their joint rows in logits [n*Width, NTok+len(Durations)] F32.
func (c *Context) TDTBeamRound(logits Ref, n int, b TDTBeam, st Ref) error {
	const op = "tdt beam round"
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.tdtbCfg(op, n, b); err != nil {
		return err
	}
	width := b.NTok + len(b.Durations)
	lp, err := logits.at(c, op, "logits", mul(n, b.Width, width, 4))
	if err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTBeamStateBytes(n, b))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_tdtb_round(c.c, fp(lp), C.int64_t(n), C.int64_t(width), &c.tdtbArg, sp))
}

// TDTBeamGather: dst[r,:] = src[parent of r,:] for the n*w rows of [n*w, cols] F32.
func (c *Context) TDTBeamGather(dst, src Ref, cols int, st Ref, n int, b TDTBeam) error {
	const op = "tdt beam gather"
	if n < 0 || b.Width < 1 || b.Width > TDTBMaxWidth || n*b.Width > 65535 || cols < 0 {
		return fmt.Errorf("cuda: %s: %d streams of width %d, %d columns", op, n, b.Width, cols)
	}
	if size := mul(n, b.Width, cols, 4); dst.Buf == src.Buf && dst.Off < src.Off+size && src.Off < dst.Off+size {
		return fmt.Errorf("cuda: %s: dst and src overlap", op)
	}
	if err := c.lock(op); err != nil {
		return err
	}
	defer c.mu.Unlock()
	dp, err := dst.at(c, op, "dst", mul(n, b.Width, cols, 4))
	if err != nil {
		return err
	}
	sp2, err := src.at(c, op, "src", mul(n, b.Width, cols, 4))
	if err != nil {
		return err
	}
	sp, err := st.at(c, op, "state", TDTBeamStateBytes(n, b))
	if err != nil {
		return err
	}
	return c.status(op, C.plc_tdtb_gather(c.c, fp(dp), fp(sp2), C.int64_t(cols), sp, C.int64_t(n), C.int32_t(b.Width)))
}
