// Package dirwatch keeps a process's view of mounted files current: it
// calls reload whenever something changes in their directories, and on a
// fixed interval in any case. Directories are watched rather than files: a
// ConfigMap or downward-API volume changes by renaming its ..data symlink,
// which replaces the file a file watch would hold; and the kubelet's update
// may come while no event can be delivered, which the interval covers.
package dirwatch

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Run watches dirs and calls reload on every burst of events and every
// interval, until ctx ends. It calls reload once after the watch is set
// up, since the files may have changed between the caller's first load
// and the watch. Without fsnotify only the interval runs.
func Run(ctx context.Context, dirs []string, interval time.Duration, log *slog.Logger, reload func()) {
	w := newWatch(dirs, log)
	defer w.close()
	w.addMissing()
	reload()

	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.events:
			if !ok {
				w.events = nil
				continue
			}
			w.note(ev)
			w.drain()
			reload()
		case err, ok := <-w.errs:
			// Read, or fsnotify blocks on it and delivers no more events.
			if !ok {
				w.errs = nil
				continue
			}
			log.Warn("config watch error; the periodic resync still runs", "error", err)
		case <-tick.C:
			w.addMissing()
			reload()
		}
	}
}

// watch holds the watcher. Without one (fsnotify failed) its channels are
// nil and only the interval runs.
type watch struct {
	w        *fsnotify.Watcher
	events   <-chan fsnotify.Event
	errs     <-chan error
	dirs     []string
	watching map[string]bool
	log      *slog.Logger
}

func newWatch(dirs []string, log *slog.Logger) *watch {
	d := &watch{dirs: dirs, watching: map[string]bool{}, log: log}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("cannot watch the config directory; relying on the periodic resync", "error", err)
		return d
	}
	d.w, d.events, d.errs = w, w.Events, w.Errors
	return d
}

func (d *watch) close() {
	if d.w != nil {
		_ = d.w.Close()
	}
}

// addMissing watches the directories not watched yet (one may not exist
// yet, or may have been removed and come back).
func (d *watch) addMissing() {
	if d.w == nil {
		return
	}
	for _, dir := range d.dirs {
		if d.watching[dir] {
			continue
		}
		if err := d.w.Add(dir); err != nil {
			d.log.Debug("cannot watch directory yet", "dir", dir, "error", err)
			continue
		}
		d.watching[dir] = true
	}
}

// drain takes the events already queued, so that a burst (a symlink swap is
// several events) costs one reload.
func (d *watch) drain() {
	for {
		select {
		case ev, ok := <-d.events:
			if !ok {
				d.events = nil
				return
			}
			d.note(ev)
		default:
			return
		}
	}
}

// note forgets the watch of a directory that was itself removed, so the
// interval adds it again when it comes back.
func (d *watch) note(ev fsnotify.Event) {
	if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && d.watching[ev.Name] {
		d.watching[ev.Name] = false
	}
	if d.log.Enabled(context.Background(), slog.LevelDebug) {
		d.log.Debug("config directory event", "event", ev.String())
	}
}

// Snapshot is the directory to read a mounted volume's files from, so that
// they come from one version: the files of a Secret or ConfigMap volume are
// links into its ..data directory, which the kubelet swaps atomically on an
// update, so a certificate and its key read through the target of ..data
// never come from two versions. A directory without ..data (not a
// kubelet-managed volume) is itself.
func Snapshot(dir string) string {
	if snap, err := filepath.EvalSymlinks(filepath.Join(dir, "..data")); err == nil {
		return snap
	}
	return dir
}
