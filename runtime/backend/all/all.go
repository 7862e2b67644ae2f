// Package all registers every backend this build has: the pure-Go backend always, the native
// CPU backend in cgo builds (in nocgo builds it registers a factory that says why it is absent).
// Programs blank-import it and pick a backend with backend.New.
package all

import (
	_ "github.com/parleyhq/parley/runtime/backend/cpu"
	_ "github.com/parleyhq/parley/runtime/backend/purego"
)
