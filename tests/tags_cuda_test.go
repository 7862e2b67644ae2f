//go:build cuda && cgo && !nocgo

package tests

// buildTags are passed to the build of the binary under test, so that `go test -tags cuda`
// tests the binary with the CUDA backend (scripts/cuda-build first).
const buildTags = "cuda"
