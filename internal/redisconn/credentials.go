package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/slidegate/slidegate/internal/dirwatch"
)

// The files a CredentialsDir may hold (the injector maps the Secret's keys
// to these names).
const (
	CredentialsUsernameFile         = "username"
	CredentialsPasswordFile         = "password"
	CredentialsSentinelUsernameFile = "sentinel-username"
	CredentialsSentinelPasswordFile = "sentinel-password"
)

// dirCredentials reads a credentials directory (a mounted Secret) for
// every new connection, so that a rotated password is used without a
// restart: the kubelet updates the files, and go-redis asks for the
// credentials each time it opens a connection (CredentialsProviderContext).
// Connections already open stay authenticated as they were.
//
// A directory that holds neither file, or cannot be read, gives the last
// credentials read from it (none before the first): a Secret that loses
// its keys (a rollback to a manager that does not write them) must not
// turn a working sidecar into one that connects without AUTH.
type dirCredentials struct {
	dir string

	mu                 sync.Mutex
	username, password string
}

// read returns the directory's credentials as they are now.
func (d *dirCredentials) read(context.Context) (string, string, error) {
	user, pass, err := readCredentials(d.dir, CredentialsUsernameFile, CredentialsPasswordFile)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil || (user == "" && pass == "") {
		return d.username, d.password, nil
	}
	d.username, d.password = user, pass
	return user, pass, nil
}

// readCredentials reads the two files of dir from one version of the
// mounted Secret; a missing file is "". Trailing newlines (a file written
// by hand) are dropped.
func readCredentials(dir, userFile, passFile string) (user, pass string, err error) {
	snap := dirwatch.Snapshot(dir)
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(snap, name))
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("redis credentials: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if user, err = read(userFile); err != nil {
		return "", "", err
	}
	if pass, err = read(passFile); err != nil {
		return "", "", err
	}
	return user, pass, nil
}
