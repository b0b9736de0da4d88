package testsupport

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// SecretVolume is a directory laid out as the kubelet lays out a mounted
// Secret or ConfigMap: each file a link into ..data, itself a link to the
// current version's directory, swapped at once by a rename.
type SecretVolume struct {
	Dir      string
	versions int
}

// NewSecretVolume is an empty volume in a temporary directory.
func NewSecretVolume(tb testing.TB) *SecretVolume {
	tb.Helper()
	return &SecretVolume{Dir: tb.TempDir()}
}

// Set makes files (name → content) the volume's content, as the kubelet
// does when the Secret changes: files absent from it disappear.
func (v *SecretVolume) Set(tb testing.TB, files map[string]string) {
	tb.Helper()
	v.versions++
	name := "..v" + strconv.Itoa(v.versions)
	if err := os.Mkdir(filepath.Join(v.Dir, name), 0o755); err != nil {
		tb.Fatal(err)
	}
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(v.Dir, name, f), []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(name, tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		tb.Fatal(err)
	}
	entries, err := os.ReadDir(v.Dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); n[0] != '.' {
			if _, ok := files[n]; !ok {
				_ = os.Remove(filepath.Join(v.Dir, n))
			}
		}
	}
	for f := range files {
		_ = os.Symlink(filepath.Join("..data", f), filepath.Join(v.Dir, f)) // exists after the first version
	}
}
