//go:build cgo && !nocgo && !cuda

package tests

// buildTags are passed to the build of the binary under test.
const buildTags = ""
