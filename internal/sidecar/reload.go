package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

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

func (s *Sidecar) reload() error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()

	cfgData, cfgErr := readBounded(s.opts.ConfigFile, maxConfigFileBytes)
	var labelsData []byte
	var labelsErr error
	if s.opts.PodLabelsFile != "" {
		labelsData, labelsErr = readBounded(s.opts.PodLabelsFile, maxLabelsFileBytes)
	}
	cur := s.state.Load()
	// The controller deletes the ConfigMap with the namespace's last policy,
	// and the kubelet then empties the (optional) volume. A missing file
	// therefore means "no policies": forward everything, instead of
	// enforcing deleted policies forever. At start it may also mean the
	// controller has not written the ConfigMap yet, so a fresh sidecar waits
	// one resync interval (unready) before it concludes so; a sidecar
	// restarted after the last policy went must not stay unready forever.
	// A ConfigMap that is there but lacks the file is a bad config instead.
	missing := errors.Is(cfgErr, fs.ErrNotExist)
	if missing {
		if err := configMapGone(s.opts.ConfigFile); err != nil {
			cfgErr, missing = err, false
		}
	}
	noPolicies := missing &&
		(cur != nil || time.Since(s.created) >= s.opts.ConfigResyncInterval)
	if noPolicies {
		cfgData, cfgErr = nil, nil
	}
	cfgSum, labelsSum := sha256.Sum256(cfgData), sha256.Sum256(labelsData)

	if cfgErr == nil && labelsErr == nil && cur != nil && cur.configSum == cfgSum && cur.labelsSum == labelsSum {
		if s.lastFailure != "" {
			// The files went back to the config in force.
			s.lastFailure = ""
			s.metrics.lastReloadOK.Set(1)
		}
		return errUnchanged
	}

	st, err := func() (*state, error) {
		if cfgErr != nil {
			return nil, fmt.Errorf("reading config: %w", cfgErr)
		}
		if labelsErr != nil {
			return nil, fmt.Errorf("reading pod labels: %w", labelsErr)
		}
		cfg := &sidecarconfig.Config{Version: sidecarconfig.Version, Namespace: cur.namespaceOrEmpty()}
		if !noPolicies {
			var err error
			if cfg, err = sidecarconfig.Parse(cfgData); err != nil {
				return nil, err
			}
		}
		labels, err := ParseLabels(labelsData)
		if err != nil {
			return nil, fmt.Errorf("pod labels %s: %w", s.opts.PodLabelsFile, err)
		}
		return compile(cfg, labels, cfgSum, labelsSum)
	}()
	if err != nil {
		// One log line and one count per distinct failure, not one per resync.
		key := err.Error() + "/" + hex.EncodeToString(cfgSum[:8]) + hex.EncodeToString(labelsSum[:8])
		if key != s.lastFailure {
			s.lastFailure = key
			s.metrics.reloads.WithLabelValues("failure").Inc()
			s.metrics.lastReloadOK.Set(0)
			if cur != nil {
				s.log.Error("config not loaded; the last good config stays in force",
					"configFile", s.opts.ConfigFile, "revision", cur.revision, "error", err)
			} else {
				s.log.Error("config not loaded; no config yet, not ready",
					"configFile", s.opts.ConfigFile, "error", err)
			}
		}
		return err
	}
	s.lastFailure = ""
	s.bindCounters(st, cur)
	s.state.Store(st)

	s.metrics.reloads.WithLabelValues("success").Inc()
	s.metrics.lastReloadOK.Set(1)
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
	return nil
}

// bindCounters gives each policy of st its request counters, and drops the
// series of policies that no longer apply.
func (s *Sidecar) bindCounters(st, old *state) {
	keep := map[string]bool{}
	for _, p := range st.policies {
		keep[p.name] = true
		for i, d := range decisions {
			p.counters[i] = s.metrics.requests.WithLabelValues(p.name, d)
		}
	}
	if old != nil {
		for _, p := range old.policies {
			if !keep[p.name] {
				s.metrics.requests.DeletePartialMatch(map[string]string{"policy": p.name})
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

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// WatchConfig keeps the config in force up to date with the files until ctx
// ends (Serve runs it; it is exported for callers that serve the handler
// themselves).
func (s *Sidecar) WatchConfig(ctx context.Context) { s.watchFiles(ctx) }

// watchFiles reloads whenever something changes in the directory of the
// config file or of the labels file, and every ConfigResyncInterval anyway.
// Directories are watched rather than files: a ConfigMap or downward-API
// volume changes by renaming its ..data symlink, which replaces the file
// a file watch would hold. It returns when ctx ends.
func (s *Sidecar) watchFiles(ctx context.Context) {
	dirs := []string{filepath.Dir(s.opts.ConfigFile)}
	if s.opts.PodLabelsFile != "" {
		if d := filepath.Dir(s.opts.PodLabelsFile); d != dirs[0] {
			dirs = append(dirs, d)
		}
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("cannot watch the config directory; relying on the periodic resync", "error", err)
	} else {
		defer func() { _ = w.Close() }()
		events, errs = w.Events, w.Errors
	}
	watching := map[string]bool{}
	addWatches := func() {
		if w == nil {
			return
		}
		for _, d := range dirs {
			if watching[d] {
				continue
			}
			if err := w.Add(d); err != nil {
				s.log.Debug("cannot watch directory yet", "dir", d, "error", err)
				continue
			}
			watching[d] = true
		}
	}
	addWatches()
	// The directory may have changed between the first load and the watch.
	_ = s.reload()

	tick := time.NewTicker(s.opts.ConfigResyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			s.noteEvent(ev, watching)
			// Coalesce a burst (a symlink swap is several events) into one read.
			for drained := false; !drained; {
				select {
				case ev, ok := <-events:
					if !ok {
						events = nil
						drained = true
					} else {
						s.noteEvent(ev, watching)
					}
				default:
					drained = true
				}
			}
			_ = s.reload()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			s.log.Warn("config watch error; the periodic resync still runs", "error", err)
		case <-tick.C:
			addWatches()
			_ = s.reload()
		}
	}
}

// noteEvent forgets the watch of a directory that was itself removed, so the
// resync adds it again when it comes back.
func (s *Sidecar) noteEvent(ev fsnotify.Event, watching map[string]bool) {
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		if watching[ev.Name] {
			watching[ev.Name] = false
		}
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("config directory event", "event", ev.String())
	}
}

// namespaceOrEmpty is the namespace of the state in force ("" for none).
func (st *state) namespaceOrEmpty() string {
	if st == nil {
		return ""
	}
	return st.namespace
}
