package rls

import (
	"io"
	"log/slog"
	"time"
)

// Options of a Server. The zero value of a field means its default.
type Options struct {
	// ConfigFile is the rendered config (rlsconfig.FileName in the mounted
	// ConfigMap). A missing file means no policies (see Reload).
	ConfigFile string
	// ResyncInterval re-reads the config even without a file event
	// (default 10s).
	ResyncInterval time.Duration
	// PeerInterval is how often the server announces itself in Redis and
	// reads how many replicas do (default 5s); a replica silent for three
	// intervals drops out of the count.
	PeerInterval time.Duration
	// Logger (default: discard).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = 10 * time.Second
	}
	if o.PeerInterval <= 0 {
		o.PeerInterval = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}
