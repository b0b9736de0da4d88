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

// The keys of a Redis credentials Secret: the one the manager's
// --redis-secret-name names, and the copy the controller keeps in each
// namespace for its sidecars (v1alpha1.RedisCredentialsSecretName), whose
// keys the injector maps to the files above. Platform teams write them:
// changing one is a breaking change.
const (
	// SecretUsernameKey and SecretPasswordKey hold the identity shared by
	// every namespace (both optional: a password alone is the legacy AUTH
	// form).
	SecretUsernameKey = "username"
	SecretPasswordKey = "password"
	// SecretSentinelUsernameKey and SecretSentinelPasswordKey, optional,
	// are the credentials of the sentinels themselves (sentinel mode), when
	// they differ from the data nodes': an identity that may only discover
	// the master (redisadmin.SentinelDiscoveryACL), as every namespace
	// gets it.
	SecretSentinelUsernameKey = "sentinel-username"
	SecretSentinelPasswordKey = "sentinel-password"
	// SecretNamespaceUsernameKey and SecretNamespacePasswordKey hold the
	// namespace's own Redis identity, in the namespace's copy only: an ACL
	// user that may call the slidegate Functions library on the
	// namespace's keys only, which the manager creates (--redis-identity).
	SecretNamespaceUsernameKey = "namespace-username"
	SecretNamespacePasswordKey = "namespace-password"
	// SecretTLSCAKey, SecretTLSCertKey and SecretTLSKeyKey, optional, are
	// the TLS material for --redis-tls, under the names cert-manager and
	// kubernetes.io/tls Secrets use: the CA that signed the Redis server's
	// certificate (instead of the system roots), and a client certificate
	// and key for a server that requires one (tls-auth-clients yes).
	SecretTLSCAKey   = "ca.crt"
	SecretTLSCertKey = "tls.crt"
	SecretTLSKeyKey  = "tls.key"
)

// SecretKeys are the keys of the manager's credentials Secret that the
// controller mirrors into each namespace and the injected sidecar reads.
var SecretKeys = []string{
	SecretUsernameKey, SecretPasswordKey, SecretSentinelUsernameKey, SecretSentinelPasswordKey,
	SecretTLSCAKey, SecretTLSCertKey, SecretTLSKeyKey,
}

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
//
// The kubelet publishes a new version by pointing ..data at a new
// directory and then removes the previous one: a read that resolved
// ..data just before the swap can find its first file and not its second,
// which is gone with that directory, and so hold half of one version (the
// username without its password). Such a pair is no version at all: the
// files are read again, until ..data points where it pointed before the
// reads (then both came from one version that was still there). A
// directory that changed during every read is an error, on which the
// caller keeps the last pair it read, never a half pair.
func readCredentials(dir, userFile, passFile string) (user, pass string, err error) {
	for range maxSnapshotReads {
		snap := dirwatch.Snapshot(dir)
		user, pass, err = readPair(snap, userFile, passFile)
		if dirwatch.Snapshot(dir) == snap {
			return user, pass, err
		}
	}
	return "", "", fmt.Errorf("%s changed during each of %d reads", dir, maxSnapshotReads)
}

// maxSnapshotReads bounds readCredentials's attempts: the kubelet swaps a
// volume once per sync, so a second read finds the new version in place.
const maxSnapshotReads = 8

// readPair reads the two files of snap; a missing file is "".
func readPair(snap, userFile, passFile string) (user, pass string, err error) {
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
