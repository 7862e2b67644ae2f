//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package hub

import (
	"context"
	"errors"
	"os"
	"syscall"
)

// lockPath takes an exclusive flock on path, created if needed, polling until it is free or ctx
// is done. The kernel drops the lock when its holder dies, so no stale detection is needed. The
// lock file is removed on unlock; a waiter that locked a file already removed retries on the new
// one.
func lockPath(ctx context.Context, path string) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			if err == nil || !(errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR)) {
				break
			}
			if err = sleepCtx(ctx, lockPoll); err != nil {
				f.Close()
				return nil, err
			}
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		// The previous holder may have removed path after we opened it.
		held, err1 := f.Stat()
		cur, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, cur) {
			return func() {
				os.Remove(path)
				f.Close() // releases the lock
			}, nil
		}
		f.Close()
		if err1 != nil {
			return nil, err1
		}
		if err2 != nil && !errors.Is(err2, os.ErrNotExist) {
			return nil, err2
		}
	}
}
