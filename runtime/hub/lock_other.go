//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package hub

import "context"

func lockPath(ctx context.Context, path string) (unlock func(), err error) {
	return lockExcl(ctx, path)
}
