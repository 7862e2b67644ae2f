package tensor

import "errors"

// ErrUnsupported is wrapped by errors for cases a backend, or the native code under it, does not
// implement (a dtype, a function, an instruction-set level, a size). Callers test for it with
// errors.Is and fall back or skip; package backend re-exports it as backend.ErrUnsupported.
var ErrUnsupported = errors.New("not supported by this backend")
