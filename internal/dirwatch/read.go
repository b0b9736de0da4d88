package dirwatch

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ReadFile reads path, at most limit bytes, from one snapshot of the volume
// it is in. The kubelet updates a ConfigMap, Secret or downward-API volume
// by writing a new snapshot directory, renaming the ..data link to it, and
// then removing the old snapshot at once; a read that followed ..data to
// the old snapshot just before the rename finds nothing when it gets there
// (measured: 15 of 168,473 reads during back-to-back swaps). That is not a
// missing file but a swap, so ReadFile reads again when ..data has moved
// meanwhile; a file that is missing from the snapshot in force is missing
// (fs.ErrNotExist).
func ReadFile(path string, limit int64) ([]byte, error) {
	data := filepath.Join(filepath.Dir(path), "..data")
	for range 8 {
		before, _ := os.Readlink(data)
		b, err := readBounded(path, limit)
		if !errors.Is(err, fs.ErrNotExist) {
			return b, err
		}
		if after, _ := os.Readlink(data); after == before {
			return nil, err
		}
	}
	return readBounded(path, limit)
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}
