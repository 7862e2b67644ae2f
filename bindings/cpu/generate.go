package cpu

// After editing anything under native/, regenerate native_hash.go so that the go command
// rebuilds the C code (TestNativeSourcesHash fails until then).
//go:generate go run ./internal/gennativehash
