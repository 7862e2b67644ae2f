package main

import (
	"bufio"
	"bytes"
	"os"
	"strconv"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// kvBytesPerPos is the KV cache a position of m takes with elements of kv: keys and values of
// every layer.
func kvBytesPerPos(m *llama.Model, kv tensor.DType) int64 {
	return int64(m.Layers) * int64(m.KVHeads*m.HeadDim) * 2 * int64(kv.TypeSize())
}

// minCutCtx is the least context a model's default may be cut to before serve refuses to start.
const minCutCtx = 256

// kvPlan is the context and KV-cache size a served model gets.
type kvPlan struct {
	ctx, slots int
	capped     bool // the default was cut to fit the memory budget
	tight      bool // an explicit --ctx alone needs more than the budget
}

// planKV chooses a model's context (positions per sequence) and cache slots (positions of all
// sequences together). ctxFlag, kvMiB: the flags (0: not given); trained: the model's training
// context; perPos: bytes of cache a position takes; budget: bytes the caches may take (0:
// unknown, no limit). --kv-mem, when given, decides the slots; otherwise the slots are ctx ×
// parallel, cut to the budget, but never below one whole sequence; the context itself is cut
// to the budget only when --ctx was not given (a model trained on 128k positions gets as many as
// the memory holds, not an allocation that cannot be backed).
func planKV(ctxFlag, kvMiB, parallel, trained int, perPos, budget int64) kvPlan {
	p := kvPlan{ctx: ctxFlag} // past the training context too, as llama.cpp allows (serve warns)
	if p.ctx == 0 {
		p.ctx = trained
	}
	if kvMiB > 0 {
		p.slots = int(int64(kvMiB) << 20 / perPos)
		return p
	}
	want := int64(p.ctx) * int64(parallel)
	fit := want
	if budget > 0 {
		fit = min(want, budget/perPos)
	}
	if fit < want {
		p.capped = true
		if ctxFlag == 0 && fit < int64(p.ctx) {
			p.ctx = max(int(fit), 1)
		}
	}
	p.slots = int(max(fit, int64(p.ctx)))
	p.tight = budget > 0 && int64(p.ctx)*perPos > budget
	return p
}

// kvBudget is the memory the KV caches of be may take, in bytes, when --kv-mem is not given:
// three quarters of the device memory free now for a backend with memory of its own (the
// weights are already there), else half of the host memory available now (MemAvailable); 0
// when neither is known.
func kvBudget(be backend.Backend) int64 {
	if m, ok := be.(backend.MemoryReporter); ok {
		if free, err := m.FreeMemory(); err == nil && free > 0 {
			return free / 4 * 3
		}
		return 0
	}
	return hostAvailable() / 2
}

// hostAvailable returns MemAvailable of /proc/meminfo in bytes, 0 where there is none.
func hostAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil || kb < 0 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
