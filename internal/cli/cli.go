// Package cli is what slidegate's commands share around their flags: the
// one shape of the servers (Command: flags, configuration, a run until a
// signal, exit codes), and for the data-plane commands (cmd/sidecar,
// cmd/rls) every flag also settable from the environment and the JSON
// logger with its level.
package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// EnvPrefix prefixes the environment variable of every flag:
// --listen-address is also SLIDEGATE_LISTEN_ADDRESS.
const EnvPrefix = "SLIDEGATE_"

// EnvName is the environment variable of a flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag of fs not given on the command line from its
// environment variable (EnvName), if that is set: a flag beats the
// environment, which beats the default. Call it after fs.Parse.
func ApplyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v, ok := lookup(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", EnvName(f.Name), e)
			}
		}
	})
	return err
}

// ParseLevel reads a --log-level value.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger returns the JSON logger the commands log with.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
