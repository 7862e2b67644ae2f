package hub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// lockPoll is how often a waiter retries a held lock.
const lockPoll = 50 * time.Millisecond

// Stale detection for exclusive-create lock files: the holder refreshes the file's modification
// time every lockRefresh; a file not refreshed for lockStale is taken over.
const (
	lockRefresh = 10 * time.Second
	lockStale   = 60 * time.Second
)

// lockExcl acquires path by creating it with O_EXCL. It cannot tell a live holder that stopped
// refreshing (a suspended process) from a dead one, and two waiters breaking the same stale lock
// at the same instant may both proceed.
func lockExcl(ctx context.Context, path string) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			fmt.Fprintln(f, strconv.Itoa(os.Getpid()))
			f.Close()
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				tick := time.NewTicker(lockRefresh)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case t := <-tick.C:
						_ = os.Chtimes(path, t, t)
					}
				}
			}()
			return func() {
				close(stop)
				<-done
				os.Remove(path)
			}, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) > lockStale {
			os.Remove(path)
			continue
		}
		if err := sleepCtx(ctx, lockPoll); err != nil {
			return nil, err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
