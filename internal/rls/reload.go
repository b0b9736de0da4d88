package rls

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/slidegate/slidegate/internal/dirwatch"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// maxConfigFileBytes bounds the config file read (a ConfigMap holds at
// most 1 MiB).
const maxConfigFileBytes = 4 << 20

// loader remembers what was loaded, so an unchanged file is not parsed
// again and a bad one is reported once.
type loader struct {
	mu          sync.Mutex
	data        []byte
	loaded      bool
	lastFailure string
}

// Reload reads the config file now and, if it changed and is valid, puts it
// in force. An invalid or unreadable file keeps the config in force (the
// last good one) and is returned as the error.
//
// A missing file means no policies: the ConfigMap volume is optional, and
// the kubelet fills it before the container starts when the ConfigMap
// exists, so a missing file at start means the controller has rendered no
// RLS policy (or deleted the ConfigMap with the last one). The server is
// then ready and answers OK without limits, as it will for any descriptor
// no policy matches.
func (s *Server) Reload() error {
	l := &s.loader
	l.mu.Lock()
	defer l.mu.Unlock()
	data, err := dirwatch.ReadFile(s.opts.ConfigFile, maxConfigFileBytes)
	if errors.Is(err, fs.ErrNotExist) {
		data, err = []byte{}, nil
	}
	if err == nil && l.loaded && bytes.Equal(data, l.data) {
		if l.lastFailure != "" {
			// The file went back to the config in force.
			l.lastFailure = ""
			s.metrics.reloads.Recovered()
			s.log.Info("config file matches the config in force again", "file", s.opts.ConfigFile)
		}
		return nil
	}
	cfg := &rlsconfig.Config{Version: rlsconfig.Version}
	if err == nil && len(data) > 0 {
		cfg, err = rlsconfig.Parse(data)
	}
	var ix *index
	if err == nil {
		ix, err = newIndex(cfg)
	}
	if err != nil {
		s.metrics.reloads.Failed()
		if msg := err.Error(); msg != l.lastFailure {
			l.lastFailure = msg
			s.log.Error("config not loaded; the last good config stays in force", "file", s.opts.ConfigFile, "error", err)
		}
		return err
	}
	ix.revision = rlsconfig.Revision(data)
	s.bindCounters(ix, s.state.Load())
	s.state.Store(ix)
	l.data, l.loaded, l.lastFailure = data, true, ""
	s.metrics.reloads.Loaded(len(cfg.Skipped))
	s.metrics.policies.Set(float64(len(cfg.Policies)))
	s.log.Info("config loaded", "file", s.opts.ConfigFile, "policies", len(cfg.Policies))
	if len(cfg.Skipped) > 0 {
		s.log.Warn("policies of a newer slidegate not enforced: this server does not know their fields; upgrade it",
			"policiesSkipped", sidecarconfig.SkippedNames(cfg.Skipped), "configVersion", cfg.Version)
	}
	return nil
}

// WatchConfig reloads on every change in the config file's directory (the
// kubelet swaps a ConfigMap volume's ..data link) and every ResyncInterval
// in any case (dirwatch), until ctx ends.
func (s *Server) WatchConfig(ctx context.Context) {
	dirwatch.Run(ctx, []string{filepath.Dir(s.opts.ConfigFile)}, s.opts.ResyncInterval, s.log,
		func() { _ = s.Reload() }) // logged and counted by Reload
}

// peerKey is the presence key under which the RLS replicas count
// themselves. Every replica serves every policy, so one key counts them
// all; a sidecar's rule ids are "<namespace>/<name>", never "rls".
const peerKey = "rls"

// AnnounceLoop tells Redis every PeerInterval (more often while the fleet
// settles, see limiter.AnnounceLoop) that this replica serves, and learns
// how many do: each fail-open policy's local share while Redis is away is
// ceil(limit/count). While Redis cannot answer, the last count stays.
// A Decider that cannot count (a test's) leaves the count unknown.
func (s *Server) AnnounceLoop(ctx context.Context) {
	a, ok := s.lim.(limiter.Announcer)
	if !ok {
		return
	}
	limiter.AnnounceLoop(ctx, a, s.opts.PeerInterval, func() []string { return []string{peerKey} },
		func(counts map[string]int, err error) {
			if n, ok := counts[peerKey]; ok {
				s.peers.Store(int64(n))
				s.metrics.peers.Set(float64(n))
			} else if err != nil {
				s.log.Debug("announcing to Redis failed; the last peer count stays", "error", err)
			}
		})
}

// bindCounters gives each policy of ix its request series, and drops the
// series of the policies of old that ix no longer has, as the sidecar does:
// a gateway's policies come and go with its tenants, and their series
// stayed until the server restarted.
func (s *Server) bindCounters(ix, old *index) {
	keep := map[string]bool{}
	ix.policies(func(p *policy) {
		keep[p.id] = true
		p.counters = s.metrics.decisions.PolicyCounters(p.id)
	})
	if old == nil {
		return
	}
	old.policies(func(p *policy) {
		if !keep[p.id] {
			s.metrics.decisions.Requests.DeletePartialMatch(map[string]string{"policy": p.id})
		}
	})
}
