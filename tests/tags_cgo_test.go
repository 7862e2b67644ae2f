//go:build cgo && !nocgo

package tests

// buildTags are passed to the build of the binary under test.
const buildTags = ""
