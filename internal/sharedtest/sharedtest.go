// Package sharedtest locates the reference material that tests compare against: the directory
// "shared" beside the repository root (real models, llama.cpp reference outputs). Tests that need
// it skip, saying why, when it is absent.
package sharedtest

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the shared directory, or skips t if there is none. $PARLEY_SHARED overrides the
// location.
func Dir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("PARLEY_SHARED"); d != "" {
		return d
	}
	d, ok := find()
	if !ok {
		t.Skip("reference directory ../shared (beside the repository root) is absent; set PARLEY_SHARED to run this test")
	}
	return d
}

// Path returns a file under the shared directory, skipping t if it does not exist.
func Path(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(Dir(t), filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Skipf("reference file %s is absent: %v", p, err)
	}
	return p
}

func find() (string, bool) {
	wd, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for d := wd; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			s := filepath.Join(filepath.Dir(d), "shared")
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				return s, true
			}
			return "", false
		}
		p := filepath.Dir(d)
		if p == d {
			return "", false
		}
		d = p
	}
}
