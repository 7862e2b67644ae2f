// Package nativehash fingerprints the native sources that bindings/cpu compiles through
// #include. The go command's build cache does not see files included from outside a package's
// directory, so bindings/cpu carries this fingerprint as a constant: regenerating it after an
// edit under native/ changes the package and makes the go command rebuild the C code.
package nativehash

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Sum returns a hex SHA-256 over the names and contents of the files bindings/cpu compiles
// under root (the repository's native directory): every .c and .h file under cpu/, and
// include/parley.h and include/parley_fn.h, in sorted order. Sources of other backends under
// root (cuda/, their headers) do not count.
func Sum(root string) (string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !(strings.HasSuffix(p, ".c") || strings.HasSuffix(p, ".h")) {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "cpu/") || rel == "include/parley.h" || rel == "include/parley_fn.h" {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
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
