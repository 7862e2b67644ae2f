//go:build cuda && cgo && !nocgo

package all

import _ "github.com/parleyhq/parley/runtime/backend/cuda" // the GPU backend, in builds with -tags cuda
