//go:build !cuda || !cgo || nocgo

package cuda

// Available reports whether the CUDA kernels are compiled into this binary.
func Available() bool { return false }

// Devices lists the usable GPUs.
func Devices() ([]Device, error) { return nil, ErrNotBuilt }

// LiveBuffers is the number of device buffers allocated and not yet closed.
func LiveBuffers() int { return 0 }

// Context is a device, a stream and scratch memory; in this build there is none.
type Context struct{}

// NewContext starts a context on CUDA device dev.
func NewContext(dev int) (*Context, error) { return nil, ErrNotBuilt }

// Close frees the context.
func (c *Context) Close() error { return nil }
