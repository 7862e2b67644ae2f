//go:build nocgo || !cgo

package tests

// buildTags are passed to the build of the binary under test, so that `go test -tags nocgo`
// tests the pure-Go binary.
const buildTags = "nocgo"
