// Package srchash fingerprints the sources of the CUDA library (libparley_cuda.a) that
// bindings/cuda links. The go command sees neither those sources nor the archive built from
// them, so bindings/cuda carries this fingerprint as a constant: regenerating it after an edit
// changes the package, and the go command then links binaries again, with the rebuilt archive.
package srchash

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sort"
)

// Sum returns a hex SHA-256 over the names and contents of native/cuda/*.cu and *.cuh,
// native/include/parley_cuda.h and parley_fn.h, and CMakeLists.txt under root (the repository),
// in sorted order.
func Sum(root string) (string, error) {
	var files []string
	for _, pat := range []string{"native/cuda/*.cu", "native/cuda/*.cuh"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return "", err
		}
		files = append(files, m...)
	}
	files = append(files, filepath.Join(root, "native/include/parley_cuda.h"), filepath.Join(root, "native/include/parley_fn.h"),
		filepath.Join(root, "CMakeLists.txt"))
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, f)
		h.Write([]byte(filepath.ToSlash(rel)))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
