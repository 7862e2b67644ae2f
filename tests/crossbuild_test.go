package tests

import (
	"os"
	"os/exec"
	"testing"
)

// TestCrossBuild: the pure-Go build (CGO_ENABLED=0), the one that runs anywhere, compiles for
// other systems and for 32-bit processors: a Linux-only system call, or a constant that
// overflows a 32-bit int, had broken these builds unnoticed.
func TestCrossBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross builds skipped in -short mode")
	}
	for _, target := range []struct{ goos, goarch string }{
		{"darwin", "arm64"}, {"windows", "amd64"}, {"freebsd", "amd64"}, {"linux", "arm64"}, {"linux", "386"},
	} {
		t.Run(target.goos+"-"+target.goarch, func(t *testing.T) {
			cmd := exec.Command("go", "build", "-o", os.DevNull, "../cmd/parley")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+target.goos, "GOARCH="+target.goarch)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}
