package main

import "testing"

func TestPlanKV(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name                         string
		ctxFlag, kvMiB, par, trained int
		perPos, budget               int64
		ctx, slots                   int
		capped, tight                bool
	}{
		{"fits", 0, 0, 8, 2048, 1024, 1 << 30, 2048, 8 * 2048, false, false},
		{"unknown budget", 0, 0, 8, 131072, 128 << 10, 0, 131072, 8 * 131072, false, false},
		{"slots cut", 0, 0, 8, 4096, mib, 10 << 30, 4096, 10240, true, false},
		{"context cut", 0, 0, 8, 131072, 128 << 10, 1 << 30, 8192, 8192, true, false},
		{"explicit ctx kept", 16384, 0, 8, 131072, 128 << 10, 1 << 30, 16384, 16384, true, true},
		{"explicit ctx over the training context, honoured", 8192, 0, 2, 4096, 1024, 1 << 30, 8192, 16384, false, false},
		{"explicit ctx over a tiny model's context", 512, 0, 8, 128, 1024, 1 << 30, 512, 4096, false, false},
		{"kv-mem decides", 0, 512, 8, 131072, 128 << 10, 1 << 30, 131072, 4096, false, false},
	} {
		p := planKV(c.ctxFlag, c.kvMiB, c.par, c.trained, c.perPos, c.budget)
		if p.ctx != c.ctx || p.slots != c.slots || p.capped != c.capped || p.tight != c.tight {
			t.Errorf("%s: %+v, want ctx %d slots %d capped %v tight %v", c.name, p, c.ctx, c.slots, c.capped, c.tight)
		}
	}
	if hostAvailable() <= 0 {
		t.Log("no /proc/meminfo here: the host budget is unknown")
	}
}
