// Package clienthash turns the client keys that slidegate's debug answers
// show (/debug/top and /debug/why, `kubectl slidegate top` and `why`) into
// keyed hashes, so that a list of the most limited clients names none of
// them: not an address, and not a hash of a low-entropy value (a user id, an
// API key of a known shape) that anyone could reverse by hashing guesses.
//
// The key is per namespace. The manager keeps one install key in its own
// namespace (InstallSecretName) and derives each namespace's key from it
// (NamespaceKey), which it mirrors into the namespace with the Redis
// credentials (SecretDataKey); the injector mounts that key into the
// sidecar (an optional volume, read again with the config). A tenant
// who reads its namespace's key can hash guesses of its own clients (it can
// ask `kubectl slidegate why` anyway), never another namespace's.
//
// The Redis keys keep their unkeyed SHA-256 (package sidecar, hashKey):
// every sidecar and every release must derive the same Redis key for a
// client, or a limit stops being exact (docs/security.md).
package clienthash

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strings"
	"sync"
)

const (
	// InstallSecretName is the Secret in the manager's namespace holding
	// the install key under SecretDataKey (the manager creates it with a
	// random key when it does not exist).
	InstallSecretName = "slidegate-install-secret"
	// SecretDataKey is the data key of the install key in
	// InstallSecretName and of a namespace's key in the mirrored
	// slidegate-redis-credentials Secret.
	SecretDataKey = "client-hash-key"
	// MinKeyBytes is the shortest key taken: 128 bits.
	MinKeyBytes = 16
	// global is the one key that names no client (sidecar keyGlobal).
	global = "global"
)

// NewInstallKey is a fresh random install key, hex-encoded (64 characters,
// 256 bits).
func NewInstallKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// NamespaceKey derives namespace's key from the install key:
// HMAC-SHA256(install, label ‖ namespace), hex-encoded. One namespace's key
// says nothing about another's or about the install key.
func NamespaceKey(install []byte, namespace string) string {
	m := hmac.New(sha256.New, install)
	m.Write([]byte("slidegate client-hash-key v1\x00"))
	m.Write([]byte(namespace))
	return hex.EncodeToString(m.Sum(nil))
}

// Hasher hashes client keys with one key. It is safe for concurrent use.
type Hasher struct {
	key []byte
	id  string
	// macs are HMACs keyed with key, reused: a 429 pays for one Sum.
	macs sync.Pool
	// Configured is false for a Random hasher.
	Configured bool
}

// New is a Hasher on key, which must be at least MinKeyBytes long.
func New(key string) (*Hasher, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("client hash key: %d bytes, want at least %d", len(key), MinKeyBytes)
	}
	h := &Hasher{key: []byte(key), Configured: true}
	h.macs.New = func() any { return hmac.New(sha256.New, h.key) }
	h.id = hex.EncodeToString(h.macBytes("slidegate client-hash-key id"))[:12]
	return h, nil
}

// Random is a Hasher on a key of its own, for a sidecar that was given
// none: its hashes are still keyed, but match no other sidecar's.
func Random() *Hasher {
	h, _ := New(NewInstallKey())
	h.Configured = false
	return h
}

// ID names the key without revealing it (a hash of it), so that answers
// hashed with different keys are not merged.
func (h *Hasher) ID() string { return h.id }

// Sum is the keyed hash of a client key as the sidecar derives it
// ("ip:192.0.2.1", "h:<sha-256>", "global"): its source prefix, kept so a
// reader sees what kind of client it is, and 128 bits of
// HMAC-SHA256(key, clientKey), base64url. The one global key stays as it is.
func (h *Hasher) Sum(clientKey string) string {
	if clientKey == global {
		return global
	}
	prefix := ""
	if i := strings.IndexByte(clientKey, ':'); i > 0 && i < 8 {
		prefix = clientKey[:i+1]
	}
	return prefix + base64.RawURLEncoding.EncodeToString(h.macBytes(clientKey)[:16])
}

// macBytes is HMAC-SHA256(key, s).
func (h *Hasher) macBytes(s string) []byte {
	m := h.macs.Get().(hash.Hash)
	defer h.macs.Put(m)
	m.Reset()
	_, _ = io.WriteString(m, s)
	return m.Sum(nil)
}
