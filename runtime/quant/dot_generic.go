//go:build !amd64 || noasm

package quant

// dotKernelSet names the kernels in use: on this build always the pure-Go ones.
const dotKernelSet = "go"
