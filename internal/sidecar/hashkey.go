package sidecar

import (
	"bytes"
	"os"

	"github.com/slidegate/slidegate/internal/clienthash"
)

// The client keys that /debug shows are keyed hashes (package clienthash)
// with the namespace's key, which the controller mirrors into the
// namespace's slidegate-redis-credentials Secret and the injector mounts as
// an optional file (Options.ClientHashKeyFile). A pod often starts before
// its namespace's key is mirrored (a Deployment and its first policy
// applied together), so the file may appear later: it is read again with
// the config (the kubelet refreshes the volume on its pod sync). Until
// then the sidecar hashes with a random key of its own: still keyed, but
// its /debug/top does not merge with other pods' (kubectl slidegate top
// says so).

// loadHashKey (re)reads the key file and puts a new key in force, which
// starts /debug/top's counts afresh. A missing, empty or short file keeps
// the key in force (a random one at first).
func (s *Sidecar) loadHashKey() {
	cur := s.hasher.Load()
	var key []byte
	if s.opts.ClientHashKeyFile != "" {
		b, err := os.ReadFile(s.opts.ClientHashKeyFile)
		if err == nil {
			key = bytes.TrimSpace(b)
		}
	}
	h, err := clienthash.New(string(key))
	switch {
	case err != nil && cur == nil:
		h = clienthash.Random()
		// The Secret is the file's (the namespace's Redis credentials, as
		// injected): named by its path, so that the sidecar links no API
		// types for a name.
		s.log.Warn("no client hash key yet: /debug hashes client keys with a key of this process only until the mounted Secret has "+
			clienthash.SecretDataKey, "file", s.opts.ClientHashKeyFile)
	case err != nil:
		if len(key) > 0 {
			s.log.Warn("the client hash key file holds no usable key; keeping the key in force", "file", s.opts.ClientHashKeyFile, "error", err)
		}
		return
	case cur != nil && cur.ID() == h.ID():
		return
	default:
		s.log.Info("client hash key loaded; /debug/top counts afresh", "keyID", h.ID())
	}
	s.hasher.Store(h)
	s.top.rekey(h.ID())
}
