package cuda

import (
	"errors"
	"os"
	"testing"
)

// requireGPU reports whether PARLEY_REQUIRE_GPU=1 makes a missing GPU a failure.
func requireGPU() bool { return os.Getenv("PARLEY_REQUIRE_GPU") == "1" }

// TestNoGPUOrNotBuilt checks what a machine without a usable GPU (or a build without CUDA) gets:
// a clear error from Devices and NewContext, never a panic.
func TestNoGPUOrNotBuilt(t *testing.T) {
	devs, err := Devices()
	if !Available() {
		if !errors.Is(err, ErrNotBuilt) {
			t.Fatalf("Devices() in a build without CUDA: %v, want ErrNotBuilt", err)
		}
		if _, err := NewContext(0); !errors.Is(err, ErrNotBuilt) {
			t.Fatalf("NewContext(0) in a build without CUDA: %v, want ErrNotBuilt", err)
		}
		if requireGPU() {
			t.Fatal("PARLEY_REQUIRE_GPU=1 but this binary was built without CUDA (-tags cuda)")
		}
		return
	}
	if err == nil {
		if len(devs) == 0 {
			t.Fatal("Devices() returned no devices and no error")
		}
		for _, d := range devs {
			t.Logf("GPU %d: %s, compute capability %d.%d, %d SMs, %d MiB (%d MiB free), %s %s",
				d.Index, d.Name, d.Major, d.Minor, d.Multiprocessors, d.MemoryTotal>>20, d.MemoryFree>>20, d.PCIBusID, d.UUID)
		}
		return
	}
	if requireGPU() {
		t.Fatalf("PARLEY_REQUIRE_GPU=1 but no GPU is usable: %v", err)
	}
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Devices() without a GPU: %v, want an error wrapping ErrNoDevice", err)
	}
	t.Logf("as expected without a GPU: %v", err)
	if c, err := NewContext(0); err == nil {
		c.Close()
		t.Fatal("NewContext(0) succeeded although Devices() found no GPU")
	} else {
		t.Logf("NewContext(0): %v", err)
	}
	if n := LiveBuffers(); n != 0 {
		t.Fatalf("LiveBuffers() = %d with no context", n)
	}
}
