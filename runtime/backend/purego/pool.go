package purego

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// job is one parallel operation split into units of work. unit(w, u) computes unit u on worker
// w (0 is the calling goroutine, 1.. the pool's goroutines); units of one job touch disjoint
// outputs.
type job interface{ unit(w, u int) }

// Fields of pool.claim: generation, unit count and next unclaimed unit.
const (
	unitBits = 22
	unitMask = 1<<unitBits - 1
	maxUnits = unitMask
)

// spinFor is how long an idle worker polls for the next job before it sleeps. Decoding issues
// operations microseconds apart, far less than waking a sleeping goroutine costs.
const spinFor = 200 * time.Microsecond

// spinYield is how many polls a spinning goroutine makes between yields to the scheduler, which
// take its lock: often enough to let other goroutines run, rarely enough to cost little.
const spinYield = 4096

// spinWait is how many polls the caller makes for units still running on workers before it
// sleeps until they are done.
const spinWait = 8 * spinYield

// pool is a fixed set of worker goroutines started once. An operation publishes its job and
// unit count in one atomic word together with a new generation number; the calling goroutine
// and every worker that sees the word claim units from it until none are left, and the caller
// returns once every unit is done. A worker that has just finished a job polls for the next for
// a while, then sleeps until woken. Nothing is allocated per operation: jobs are fields of the
// Backend, passed as pointers, and a worker that arrives late finds nothing to claim.
type pool struct {
	threads int
	claim   atomic.Uint64 // gen<<2*unitBits | units<<unitBits | next
	done    atomic.Int64  // units of the current generation finished
	gen     uint64        // generation of the current or last job (written by the caller only)
	job     job           // valid for a worker once it has claimed a unit of the current generation
	stopped atomic.Bool
	// waiting is set while the caller sleeps until the last unit is done; finished wakes it.
	waiting  atomic.Bool
	finished chan struct{}
	workers  []*worker
	exited   sync.WaitGroup
}

type worker struct {
	asleep atomic.Bool
	wake   chan struct{}
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, finished: make(chan struct{}, 1)}
	for i := 1; i < threads; i++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.exited.Add(1)
		go p.loop(i, w)
	}
	return p
}

// work claims and runs units of generation gen until none are left.
func (p *pool) work(w int, gen uint64) {
	for {
		c := p.claim.Load()
		units := c >> unitBits & unitMask
		next := c & unitMask
		if c>>(2*unitBits) != gen || next >= units {
			return
		}
		if !p.claim.CompareAndSwap(c, c+1) {
			continue
		}
		p.job.unit(w, int(next))
		if p.done.Add(1) == int64(units) && p.waiting.Load() && p.waiting.CompareAndSwap(true, false) {
			p.finished <- struct{}{}
		}
	}
}

func (p *pool) loop(id int, w *worker) {
	defer p.exited.Done()
	seen := uint64(0)
	for {
		gen := p.waitNew(w, seen)
		if p.stopped.Load() {
			return
		}
		seen = gen
		p.work(id, gen)
	}
}

// waitNew returns the generation of the claim word once it differs from seen, polling for
// spinFor and then sleeping.
func (p *pool) waitNew(w *worker, seen uint64) uint64 {
	var start time.Time
	for i := 1; ; i++ {
		if g := p.claim.Load() >> (2 * unitBits); g != seen || p.stopped.Load() {
			return g
		}
		if i%256 != 0 {
			continue
		}
		if i%spinYield == 0 {
			runtime.Gosched()
		}
		if start.IsZero() {
			start = time.Now()
		} else if time.Since(start) > spinFor {
			break
		}
	}
	for {
		w.asleep.Store(true)
		if g := p.claim.Load() >> (2 * unitBits); g != seen || p.stopped.Load() {
			if !w.asleep.CompareAndSwap(true, false) {
				<-w.wake // a waker took the flag: take its token
			}
			return g
		}
		<-w.wake
	}
}

// do runs units 0..units-1 of j on the caller and the workers, and returns when all are done.
// Jobs of fewer than two units, or on a pool of one thread, run on the caller alone.
func (p *pool) do(j job, units int) {
	if units <= 0 {
		return
	}
	if units == 1 || p.threads == 1 || units > maxUnits {
		for u := 0; u < units; u++ {
			j.unit(0, u)
		}
		return
	}
	p.job = j
	p.done.Store(0)
	p.gen = (p.gen + 1) & (1<<(64-2*unitBits) - 1)
	p.claim.Store(p.gen<<(2*unitBits) | uint64(units)<<unitBits)
	for _, w := range p.workers {
		if w.asleep.Load() && w.asleep.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
	p.work(0, p.gen)
	// Units still running on workers take about as long as one unit, unless the OS has taken a
	// worker's core for another process: then the caller sleeps, so that its core can run the
	// worker.
	for i := 1; p.done.Load() != int64(units); i++ {
		if i%spinYield != 0 {
			continue
		}
		runtime.Gosched()
		if i < spinWait {
			continue
		}
		p.waiting.Store(true)
		if p.done.Load() == int64(units) && p.waiting.CompareAndSwap(true, false) {
			break
		}
		<-p.finished
		break
	}
	p.job = nil
}

// stop ends the workers.
func (p *pool) stop() {
	p.stopped.Store(true)
	for _, w := range p.workers {
		if w.asleep.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
	p.exited.Wait()
}
