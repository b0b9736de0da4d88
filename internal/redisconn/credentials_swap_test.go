package redisconn

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// kubeletVolume writes a Secret volume as the kubelet's atomic writer does:
// a new timestamped directory, ..data swapped to it, the user-visible
// symlinks, and then the previous directory removed.
type kubeletVolume struct {
	dir  string
	n    int
	prev string
}

func (v *kubeletVolume) set(t *testing.T, files map[string]string) {
	v.n++
	name := "..ts" + strconv.Itoa(v.n)
	if err := os.Mkdir(filepath.Join(v.dir, name), 0o755); err != nil {
		t.Error(err)
		return
	}
	for f, c := range files {
		if err := os.WriteFile(filepath.Join(v.dir, name, f), []byte(c), 0o600); err != nil {
			t.Error(err)
			return
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(name, tmp); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Error(err)
		return
	}
	for _, f := range []string{CredentialsUsernameFile, CredentialsPasswordFile} {
		link := filepath.Join(v.dir, f)
		if _, ok := files[f]; ok {
			_ = os.Symlink(filepath.Join("..data", f), link) // exists after the first version
		} else {
			_ = os.Remove(link)
		}
	}
	if v.prev != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, v.prev)); err != nil {
			t.Error(err)
		}
	}
	v.prev = name
}

// TestCredentialsReadDuringSwap: a connection opened while the kubelet
// swaps the mounted Secret gets both files of one version, never the
// username of one version without the password (the version it read
// first was removed before it read the second file). Such a half pair
// authenticated as the user with an empty password (WRONGPASS); where
// the new version lacks the files (a rollback to a manager that does not
// write them), the half pair became the last credentials read, which
// every later connection then used.
func TestCredentialsReadDuringSwap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		versions []map[string]string
	}{
		{"rotation", []map[string]string{
			{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "first"},
			{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "second"},
		}},
		{"keys removed", []map[string]string{
			{CredentialsUsernameFile: "tenant", CredentialsPasswordFile: "first"},
			{},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &kubeletVolume{dir: t.TempDir()}
			v.set(t, tc.versions[0])
			d := &dirCredentials{dir: v.dir}
			if u, p, _ := d.read(context.Background()); u != "tenant" || p != "first" {
				t.Fatalf("first read: %q %q", u, p)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := 1; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					v.set(t, tc.versions[i%len(tc.versions)])
				}
			})
			deadline := time.Now().Add(3 * time.Second)
			reads, bad := 0, 0
			for time.Now().Before(deadline) && bad == 0 {
				u, p, err := d.read(context.Background())
				reads++
				if err != nil || u != "tenant" || (p != "first" && p != "second") {
					bad++
					t.Errorf("read %d during a swap: user %q password %q, error %v", reads, u, p, err)
				}
			}
			close(stop)
			wg.Wait()
			t.Logf("%d reads", reads)
		})
	}
}
