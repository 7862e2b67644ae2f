package server

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/parleyhq/parley/runtime/sched"
)

// usageOfAll sums the usage of a request's streams, valid once each has ended.
func usageOfAll(sts []*sched.Stream) sched.Usage {
	var u sched.Usage
	for _, st := range sts {
		su := st.Usage()
		u.PromptTokens += su.PromptTokens
		u.CompletionTokens += su.CompletionTokens
	}
	return u
}

// tagged is an event of stream k, or its error (io.EOF at its end).
type tagged struct {
	k   int
	ev  sched.Event
	err error
}

// merge reads every stream of sts at once; next returns the next event of any (its stream's
// index with it), io.EOF once every stream has ended, or ctx's error. stop must be called
// before sts are read otherwise; it waits until no goroutine reads them.
func merge(ctx context.Context, sts []*sched.Stream) (next func() (int, sched.Event, error), stop func()) {
	if len(sts) == 1 {
		return func() (int, sched.Event, error) {
			ev, err := sts[0].Next(ctx)
			return 0, ev, err
		}, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan tagged)
	var wg sync.WaitGroup
	for k, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := st.Next(ctx)
				select {
				case ch <- tagged{k, ev, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	live := len(sts)
	next = func() (int, sched.Event, error) {
		for {
			var t tagged
			select {
			case t = <-ch:
			case <-ctx.Done(): // the readers may have given up without a word
				return 0, sched.Event{}, ctx.Err()
			}
			if t.err == io.EOF {
				if live--; live == 0 {
					return 0, sched.Event{}, io.EOF
				}
				continue
			}
			return t.k, t.ev, t.err
		}
	}
	return next, func() {
		cancel()
		wg.Wait()
	}
}

// pump passes the events of sts, the streams of j's prompts, to fn with the index of their
// choice until every stream closes, the client goes away (ctx) or fn returns false; in the last
// two cases it cancels every stream at once and drains them. It records latencies and token
// counts. It reports whether the streams ran to their end.
func (s *Server) pump(ctx context.Context, j *job, sts []*sched.Stream, fn func(choice int, ev *sched.Event) bool) bool {
	start := info(ctx).start
	last := make([]time.Time, j.choices())
	first := true
	ttft := s.metrics.ttft.WithLabelValues(j.m.Name)
	itl := s.metrics.itl.WithLabelValues(j.m.Name)
	next, stop := merge(ctx, sts)
	ok := true
	for {
		k, ev, err := next()
		if err == io.EOF {
			break
		}
		if err != nil { // the client went away
			ok = false
			break
		}
		if ev.Seq < 0 || ev.Seq >= j.g.n {
			continue
		}
		if ev.Prompt || j.replicate {
			// The prompt's, or the one sequence's: every choice of the prompt has it.
			for i := range j.g.n {
				if !fn(k*j.g.n+i, &ev) {
					ok = false
					break
				}
			}
			if !ok {
				break
			}
			continue
		}
		c := k*j.g.n + ev.Seq
		if ev.Token >= 0 {
			now := time.Now()
			if first {
				ttft.Observe(now.Sub(start).Seconds())
				first = false
			} else if !last[c].IsZero() {
				itl.Observe(now.Sub(last[c]).Seconds())
			}
			last[c] = now
		}
		if !fn(c, &ev) {
			ok = false
			break
		}
	}
	if !ok {
		for _, st := range sts {
			st.Cancel()
		}
	}
	stop()
	if !ok {
		for _, st := range sts {
			for range st.Events() {
			}
		}
	}
	u := usageOfAll(sts)
	s.metrics.prompt.WithLabelValues(j.m.Name).Add(float64(u.PromptTokens))
	s.metrics.generated.WithLabelValues(j.m.Name).Add(float64(u.CompletionTokens))
	return ok
}
