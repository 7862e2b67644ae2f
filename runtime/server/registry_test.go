package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeModel is an on-demand model whose loads and closes are counted; a load waits for gate
// when it is set, and fails with fail's error while fail is set.
type fakeModel struct {
	loads, closes atomic.Int32
	gate          chan struct{}
	fail          atomic.Pointer[error]
}

func (f *fakeModel) spec(name string, bytes int64, keep time.Duration) *OnDemandModel {
	return &OnDemandModel{Name: name, Kind: KindLLM, Bytes: bytes, KeepAlive: keep, Load: func(ctx context.Context) (*Loaded, error) {
		f.loads.Add(1)
		if f.gate != nil {
			select {
			case <-f.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if err := f.fail.Load(); err != nil {
			return nil, *err
		}
		return &Loaded{Close: func() { f.closes.Add(1) }}, nil
	}}
}

func newTestRegistry(t *testing.T, budget int64, timeout time.Duration, specs ...*OnDemandModel) *registry {
	t.Helper()
	r, err := newRegistry(specs, budget, timeout, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

// waitState waits until the named model is in state want.
func waitState(t *testing.T, r *registry, name, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if r.state(name).State == want {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: state %q, want %q", name, r.state(name).State, want)
}

func dur(d time.Duration) *time.Duration { return &d }

// Concurrent first requests load the model once, and all of them get it.
func TestRegistryOneLoad(t *testing.T) {
	f := &fakeModel{gate: make(chan struct{})}
	r := newTestRegistry(t, 0, 5*time.Second, f.spec("a", 10, time.Minute))
	const n = 16
	var wg sync.WaitGroup
	got := make([]*entry, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = r.acquire(context.Background(), "a", nil)
		}()
	}
	waitState(t, r, "a", stateLoading)
	time.Sleep(20 * time.Millisecond) // the other requests reach the wait
	close(f.gate)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || got[i] == nil || got[i] != got[0] {
			t.Fatalf("request %d: %v %p", i, errs[i], got[i])
		}
	}
	if n := f.loads.Load(); n != 1 {
		t.Errorf("%d loads, want 1", n)
	}
	if st := r.state("a"); st.State != stateLoaded || st.Refs != n {
		t.Errorf("state %+v, want loaded with %d references", st, n)
	}
	for range n {
		r.release(got[0])
	}
	if st := r.state("a"); st.State != stateLoaded || st.Refs != 0 {
		t.Errorf("after release: %+v, want loaded (keep-alive 1m), idle", st)
	}
}

// A request waits for a load at most the timeout; the load goes on, and a later request gets
// the model.
func TestRegistryLoadTimeout(t *testing.T) {
	f := &fakeModel{gate: make(chan struct{})}
	r := newTestRegistry(t, 0, 50*time.Millisecond, f.spec("a", 10, time.Minute))
	t0 := time.Now()
	_, err := r.acquire(context.Background(), "a", nil)
	if !errors.Is(err, errLoadTimeout) {
		t.Fatalf("err %v, want errLoadTimeout", err)
	}
	if d := time.Since(t0); d < 50*time.Millisecond || d > 2*time.Second {
		t.Errorf("waited %v, want about 50ms", d)
	}
	if st := r.state("a"); st.State != stateLoading || st.Refs != 0 {
		t.Errorf("state %+v, want loading with no reference", st)
	}
	close(f.gate)
	waitState(t, r, "a", stateLoaded)
	e, err := r.acquire(context.Background(), "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.release(e)
	if n := f.loads.Load(); n != 1 {
		t.Errorf("%d loads, want 1", n)
	}
	// A cancelled request stops waiting with its context's error.
	f2 := &fakeModel{gate: make(chan struct{})}
	r2 := newTestRegistry(t, 0, time.Minute, f2.spec("b", 10, time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := r2.acquire(ctx, "b", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled request: %v", err)
	}
	close(f2.gate)
}

// Under a budget, the least recently used idle model is unloaded first.
func TestRegistryLRU(t *testing.T) {
	fa, fb, fc := &fakeModel{}, &fakeModel{}, &fakeModel{}
	r := newTestRegistry(t, 100, 5*time.Second, fa.spec("a", 40, -1), fb.spec("b", 40, -1), fc.spec("c", 40, -1))
	use := func(name string) {
		t.Helper()
		e, err := r.acquire(context.Background(), name, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r.release(e)
	}
	use("a")
	use("b")
	use("a") // b is now the least recently used
	use("c")
	waitState(t, r, "b", stateUnloaded)
	if st := r.state("a").State; st != stateLoaded {
		t.Errorf("a: %s, want loaded", st)
	}
	if st := r.state("c").State; st != stateLoaded {
		t.Errorf("c: %s, want loaded", st)
	}
	if fb.closes.Load() != 1 || fa.closes.Load() != 0 {
		t.Errorf("closes a %d, b %d; want 0, 1", fa.closes.Load(), fb.closes.Load())
	}
	use("b") // a is the least recently used now
	waitState(t, r, "a", stateUnloaded)
	if st := r.state("c").State; st != stateLoaded {
		t.Errorf("c: %s, want loaded", st)
	}
	r.mu.Lock()
	used := r.used
	r.mu.Unlock()
	if used != 80 {
		t.Errorf("used %d, want 80", used)
	}
}

// A model in use is not unloaded for another: it is marked, the other waits, and it unloads
// once its request ends; a model larger than the budget is refused without a load.
func TestRegistryInUseNotEvicted(t *testing.T) {
	fa, fb, fbig := &fakeModel{}, &fakeModel{}, &fakeModel{}
	r := newTestRegistry(t, 100, 5*time.Second, fa.spec("a", 60, -1), fb.spec("b", 60, -1), fbig.spec("big", 101, -1))
	ea, err := r.acquire(context.Background(), "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var eb *entry
	go func() {
		var err error
		eb, err = r.acquire(context.Background(), "b", nil)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if st := r.state("a"); st.State != stateLoaded || fa.closes.Load() != 0 {
		t.Fatalf("a in use: %+v, %d closes", st, fa.closes.Load())
	}
	if st := r.state("b").State; st != stateUnloaded || fb.loads.Load() != 0 {
		t.Fatalf("b: %s, %d loads; want unloaded while a is in use", st, fb.loads.Load())
	}
	// A request that finds a marked model waits too, and fails at its timeout.
	short, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := r.acquire(short, "a", nil); err == nil {
		t.Errorf("a marked for unloading was acquired")
	}
	r.release(ea)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fa.closes.Load() != 1 || r.state("a").State != stateUnloaded {
		t.Errorf("a: %d closes, %s; want unloaded", fa.closes.Load(), r.state("a").State)
	}
	r.release(eb)
	_, err = r.acquire(context.Background(), "big", nil)
	if !errors.Is(err, errTooLarge) || fbig.loads.Load() != 0 {
		t.Errorf("big: %v, %d loads; want errTooLarge and no load", err, fbig.loads.Load())
	}
	if st := r.state("b").State; st != stateLoaded {
		t.Errorf("b: %s, want loaded: a refused model evicts nothing", st)
	}
}

// keep_alive 0 unloads when the request ends; negative keeps the model; a positive one
// unloads after that long idle.
func TestRegistryKeepAlive(t *testing.T) {
	f := &fakeModel{}
	r := newTestRegistry(t, 0, 5*time.Second, f.spec("a", 10, time.Hour))
	e, err := r.acquire(context.Background(), "a", dur(0))
	if err != nil {
		t.Fatal(err)
	}
	if st := r.state("a").State; st != stateLoaded {
		t.Fatalf("in use: %s", st)
	}
	r.release(e)
	waitState(t, r, "a", stateUnloaded)

	e, _ = r.acquire(context.Background(), "a", dur(-1))
	r.release(e)
	time.Sleep(100 * time.Millisecond)
	if st := r.state("a").State; st != stateLoaded {
		t.Errorf("keep_alive negative: %s, want loaded", st)
	}
	e, _ = r.acquire(context.Background(), "a", dur(30*time.Millisecond))
	t0 := time.Now()
	r.release(e)
	waitState(t, r, "a", stateUnloaded)
	if d := time.Since(t0); d < 30*time.Millisecond {
		t.Errorf("unloaded after %v, before its keep-alive of 30ms", d)
	}
	// A request in between restarts the keep-alive.
	e, _ = r.acquire(context.Background(), "a", dur(time.Second))
	r.release(e)
	time.Sleep(40 * time.Millisecond)
	e, _ = r.acquire(context.Background(), "a", dur(50*time.Millisecond))
	time.Sleep(100 * time.Millisecond)
	if st := r.state("a").State; st != stateLoaded {
		t.Errorf("in use past the first keep-alive: %s", st)
	}
	r.release(e)
	waitState(t, r, "a", stateUnloaded)
	if n := f.loads.Load(); n != 3 || f.closes.Load() != 3 {
		t.Errorf("%d loads, %d closes; want 3, 3", n, f.closes.Load())
	}
}

// A failed load is reported to every request that waited for it, and the next request loads
// again.
func TestRegistryLoadFailure(t *testing.T) {
	f := &fakeModel{gate: make(chan struct{})}
	bad := errors.New("truncated file")
	f.fail.Store(&bad)
	r := newTestRegistry(t, 100, 5*time.Second, f.spec("a", 50, time.Minute))
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := r.acquire(context.Background(), "a", nil)
			errs <- err
		}()
	}
	waitState(t, r, "a", stateLoading)
	time.Sleep(20 * time.Millisecond)
	close(f.gate)
	for range n {
		if err := <-errs; !errors.Is(err, bad) {
			t.Errorf("waiter: %v, want the load's error", err)
		}
	}
	if st := r.state("a"); st.State != stateUnloaded || st.Refs != 0 || st.Error != bad.Error() {
		t.Errorf("after failure: %+v", st)
	}
	r.mu.Lock()
	used := r.used
	r.mu.Unlock()
	if used != 0 {
		t.Errorf("a failed load holds %d bytes", used)
	}
	f.fail.Store(nil)
	e, err := r.acquire(context.Background(), "a", nil)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	r.release(e)
	if n := f.loads.Load(); n != 2 {
		t.Errorf("%d loads, want 2", n)
	}
}

// unload unloads an idle model at once, and one in use when its request ends.
func TestRegistryUnload(t *testing.T) {
	f := &fakeModel{}
	r := newTestRegistry(t, 0, 5*time.Second, f.spec("a", 10, -1))
	if busy, err := r.unload(context.Background(), "a"); busy || err != nil {
		t.Errorf("unloaded model: %v %v", busy, err)
	}
	e, _ := r.acquire(context.Background(), "a", nil)
	if busy, err := r.unload(context.Background(), "a"); !busy || err != nil {
		t.Errorf("model in use: busy %v, %v", busy, err)
	}
	if st := r.state("a").State; st != stateLoaded {
		t.Errorf("in use: %s", st)
	}
	r.release(e)
	waitState(t, r, "a", stateUnloaded)
	e, _ = r.acquire(context.Background(), "a", nil)
	r.release(e)
	if busy, err := r.unload(context.Background(), "a"); busy || err != nil || r.state("a").State != stateUnloaded {
		t.Errorf("idle model: %v %v %s", busy, err, r.state("a").State)
	}
	if f.closes.Load() != 2 {
		t.Errorf("%d closes, want 2", f.closes.Load())
	}
}
