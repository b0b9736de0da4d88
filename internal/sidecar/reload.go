package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/dirwatch"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// maxConfigFileBytes bounds the config file read (a ConfigMap holds at most
// 1 MiB).
const maxConfigFileBytes = 4 << 20

// errUnchanged is returned by reload when neither file changed.
var errUnchanged = errors.New("unchanged")

// Reload reads the config and labels files now and, if either changed and
// both are valid, puts the new state in force. An invalid or unreadable file
// keeps the state in force (the error is logged once per distinct failure
// and counted). It returns nil when the files are unchanged.
func (s *Sidecar) Reload() error {
	err := s.reload()
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return err
}

// reload reads both files and puts a changed, valid pair in force: read →
// unchanged? → parse → publish, or report the failure.
func (s *Sidecar) reload() error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()

	cur := s.state.Load()
	in := s.readFiles(cur)
	if in.cfgErr == nil && in.labelsErr == nil && cur != nil && cur.configSum == in.cfgSum && cur.labelsSum == in.labelsSum {
		if s.lastFailure != "" {
			// The files went back to the config in force.
			s.lastFailure = ""
			s.metrics.reloads.Recovered()
		}
		return errUnchanged
	}
	st, err := in.parse(cur, s.opts.PodLabelsFile)
	if err != nil {
		s.reportFailure(err, in, cur)
		return err
	}
	s.publish(st, cur)
	return nil
}

// files are the config and labels files as read once, with their digests.
type files struct {
	cfgData, labelsData []byte
	cfgErr, labelsErr   error
	// noPolicies: the config file is gone and means "no policies".
	noPolicies        bool
	cfgSum, labelsSum [sha256.Size]byte
}

// readFiles reads the config and labels files; cur is the state in force.
func (s *Sidecar) readFiles(cur *state) files {
	var in files
	in.cfgData, in.cfgErr = dirwatch.ReadFile(s.opts.ConfigFile, maxConfigFileBytes)
	if s.opts.PodLabelsFile != "" {
		in.labelsData, in.labelsErr = dirwatch.ReadFile(s.opts.PodLabelsFile, maxLabelsFileBytes)
	}
	// The controller deletes the ConfigMap with the namespace's last policy,
	// and the kubelet then empties the (optional) volume. A missing file
	// therefore means "no policies": forward everything, instead of
	// enforcing deleted policies forever. At start it may also mean the
	// controller has not written the ConfigMap yet, so a fresh sidecar waits
	// one resync interval (unready) before it concludes so; a sidecar
	// restarted after the last policy went must not stay unready forever.
	// A ConfigMap that is there but lacks the file is a bad config instead.
	missing := errors.Is(in.cfgErr, fs.ErrNotExist)
	if missing {
		if err := configMapGone(s.opts.ConfigFile); err != nil {
			in.cfgErr, missing = err, false
		}
	}
	in.noPolicies = missing &&
		(cur != nil || time.Since(s.created) >= s.opts.ConfigResyncInterval)
	if in.noPolicies {
		in.cfgData, in.cfgErr = nil, nil
	}
	in.cfgSum, in.labelsSum = sha256.Sum256(in.cfgData), sha256.Sum256(in.labelsData)
	return in
}

// parse turns the files into the state to put in force; cur is the state
// in force (its namespace stays when there are no policies).
func (in files) parse(cur *state, labelsFile string) (*state, error) {
	if in.cfgErr != nil {
		return nil, fmt.Errorf("reading config: %w", in.cfgErr)
	}
	if in.labelsErr != nil {
		return nil, fmt.Errorf("reading pod labels: %w", in.labelsErr)
	}
	cfg := &sidecarconfig.Config{Version: sidecarconfig.Version, Namespace: cur.namespaceOrEmpty()}
	if !in.noPolicies {
		var err error
		if cfg, err = sidecarconfig.Parse(in.cfgData); err != nil {
			return nil, err
		}
	}
	labels, err := ParseLabels(in.labelsData)
	if err != nil {
		return nil, fmt.Errorf("pod labels %s: %w", labelsFile, err)
	}
	return compile(cfg, labels, in.cfgSum, in.labelsSum)
}

// reportFailure logs and counts a failed reload once per distinct failure,
// not once per resync; the state in force, cur, stays.
func (s *Sidecar) reportFailure(err error, in files, cur *state) {
	key := err.Error() + "/" + hex.EncodeToString(in.cfgSum[:8]) + hex.EncodeToString(in.labelsSum[:8])
	if key == s.lastFailure {
		return
	}
	s.lastFailure = key
	s.metrics.reloads.Failed()
	if cur != nil {
		s.log.Error("config not loaded; the last good config stays in force",
			"configFile", s.opts.ConfigFile, "revision", cur.revision, "error", err)
	} else {
		s.log.Error("config not loaded; no config yet, not ready",
			"configFile", s.opts.ConfigFile, "error", err)
	}
}

// publish puts st in force in place of old, and says so in the metrics and
// the log.
func (s *Sidecar) publish(st, old *state) {
	s.lastFailure = ""
	s.bindCounters(st, old)
	s.state.Store(st)

	s.metrics.reloads.Loaded(len(st.skipped))
	s.metrics.lastReloadTime.SetToCurrentTime()
	s.metrics.configLoaded.Set(1)
	s.metrics.revision.Reset()
	s.metrics.revision.WithLabelValues(st.revision).Set(1)
	s.metrics.policiesActive.Set(float64(len(st.policies)))
	s.metrics.policiesInConfig.Set(float64(st.total))
	names := make([]string, len(st.policies))
	for i, p := range st.policies {
		names[i] = p.name
	}
	s.log.Info("config loaded", "revision", st.revision, "namespace", st.namespace,
		"policiesActive", names, "policiesInConfig", st.total, "trustedProxies", len(st.trusted))
	if len(st.skipped) > 0 {
		s.log.Warn("policies of a newer slidegate not enforced: this sidecar does not know their fields; restart the pod to update its sidecar",
			"policiesSkipped", sidecarconfig.SkippedNames(st.skipped), "configVersion", sidecarconfig.Version)
	}
}

// bindCounters gives each policy of st its request counters, and drops the
// series of policies that no longer apply.
func (s *Sidecar) bindCounters(st, old *state) {
	keep := map[string]bool{}
	for _, p := range st.policies {
		keep[p.name] = true
		p.counters = s.metrics.decisions.PolicyCounters(p.name)
		if p.jwt != nil {
			p.tokens = make(map[jwtverify.Failure]prometheus.Counter, len(jwtverify.Failures)+1)
			for _, f := range append([]jwtverify.Failure{""}, jwtverify.Failures...) {
				p.tokens[f] = s.metrics.jwtTokens.WithLabelValues(p.name, tokenResult(f))
			}
		}
	}
	if old != nil {
		for _, p := range old.policies {
			if !keep[p.name] {
				s.metrics.decisions.Requests.DeletePartialMatch(map[string]string{"policy": p.name})
			}
			if !keep[p.name] || p.jwt != nil && st.policyNamed(p.name).jwt == nil {
				s.metrics.jwtTokens.DeletePartialMatch(map[string]string{"policy": p.name})
			}
		}
	}
}

// configMapGone tells why the config file is missing. The kubelet renders a
// deleted optional ConfigMap as an empty ..data snapshot: nil, the ConfigMap
// is gone. A snapshot holding other keys is a ConfigMap without the file:
// an error, so that the last good config stays in force. A directory without
// ..data is not a ConfigMap volume; there a missing file means gone too.
func configMapGone(configFile string) error {
	data := filepath.Join(filepath.Dir(configFile), "..data")
	if _, err := os.Lstat(data); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// Any error here (the snapshot was swapped while we looked) keeps the
	// config in force: the swap's own event brings another reload, whereas
	// taking "gone" for the truth would make "no policies" the last good.
	keys, err := os.ReadDir(data)
	if err != nil {
		return fmt.Errorf("reading the config volume: %w", err)
	}
	if len(keys) == 0 {
		return nil
	}
	names := make([]string, 0, 3)
	for _, k := range keys[:min(len(keys), cap(names))] {
		names = append(names, k.Name())
	}
	return fmt.Errorf("the ConfigMap has no %s (it has %d other keys: %s)",
		filepath.Base(configFile), len(keys), strings.Join(names, ", "))
}

// WatchConfig keeps the config in force up to date with the files until ctx
// ends (Serve runs it; it is exported for callers that serve the handler
// themselves).
func (s *Sidecar) WatchConfig(ctx context.Context) { s.watchFiles(ctx) }

// watchFiles reloads whenever something changes in the directory of the
// config file or of the labels file, and every ConfigResyncInterval anyway
// (dirwatch), until ctx ends.
func (s *Sidecar) watchFiles(ctx context.Context) {
	dirs := []string{filepath.Dir(s.opts.ConfigFile)}
	if s.opts.PodLabelsFile != "" {
		if l := filepath.Dir(s.opts.PodLabelsFile); l != dirs[0] {
			dirs = append(dirs, l)
		}
	}
	if s.opts.ClientHashKeyFile != "" {
		if k := filepath.Dir(s.opts.ClientHashKeyFile); !slices.Contains(dirs, k) {
			dirs = append(dirs, k)
		}
	}
	dirwatch.Run(ctx, dirs, s.opts.ConfigResyncInterval, s.log, func() { _ = s.reload(); s.loadHashKey() })
}

// namespaceOrEmpty is the namespace of the state in force ("" for none).
func (st *state) namespaceOrEmpty() string {
	if st == nil {
		return ""
	}
	return st.namespace
}
