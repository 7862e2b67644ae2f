package cuda

// After editing native/cuda, native/include/parley_cuda.h, parley_fn.h or CMakeLists.txt, rebuild the library
// (scripts/cuda-build) and regenerate native_hash.go, so that the go command links the new
// archive (TestNativeSourcesHash fails until then).
//go:generate go run ./internal/gensrchash
