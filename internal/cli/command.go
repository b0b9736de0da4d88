package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes of every slidegate server command.
const (
	// ExitOK: --version, or the run ended because a signal came.
	ExitOK = 0
	// ExitFailed: the run failed; the command's log says why.
	ExitFailed = 1
	// ExitUsage: the flags (or the environment) are wrong, and nothing
	// started; stderr says why, one problem a line.
	ExitUsage = 2
)

// Command is the one shape of slidegate's servers (cmd/manager,
// cmd/sidecar, cmd/rls): flags, then the configuration they give, then a
// run until SIGTERM or an interrupt, each step with its exit code. The
// commands' main functions only call Main; what they configure and run
// lives in their packages.
type Command struct {
	// Name prefixes every line of a usage error ("rls: ...").
	Name string
	// Version is the line --version prints; VersionUsage the flag's help.
	Version, VersionUsage string
	// Flags defines the command's flags on fs and returns its Setup,
	// which Main calls once they are parsed.
	Flags func(fs *flag.FlagSet) Setup
	// Signals is the context the run gets, cancelled on SIGTERM or an
	// interrupt. Nil: signal.NotifyContext. (The manager keeps
	// controller-runtime's, which also exits on a second signal.)
	Signals func() context.Context
}

// Setup completes and checks the configuration that the flags (and the
// environment) gave, and returns what runs; an error (every line of it
// one problem) makes the command exit with ExitUsage before it starts.
type Setup func() (Program, error)

// Program is a configured command.
type Program struct {
	// Run serves until ctx ends. An error ends the command with ExitFailed.
	Run func(ctx context.Context) error
	// Failed reports Run's error in the command's own log, which only the
	// command knows (JSON for the data plane, zap for the manager).
	Failed func(err error)
}

// Main runs c with args (without the program name) on fs (nil: a new
// FlagSet that exits on a parse error, with ExitUsage as flag does), and
// returns the exit code.
func (c Command) Main(fs *flag.FlagSet, args []string) int {
	return c.main(fs, args, os.Stdout, os.Stderr)
}

func (c Command) main(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	if fs == nil {
		fs = flag.NewFlagSet(c.Name, flag.ExitOnError)
	}
	setup := c.Flags(fs)
	showVersion := fs.Bool("version", false, c.VersionUsage)
	if err := fs.Parse(args); err != nil {
		// Only a FlagSet that continues on errors gets here; flag has
		// printed the problem and the usage already.
		return ExitUsage
	}
	if *showVersion {
		_, _ = fmt.Fprintln(stdout, c.Version)
		return ExitOK
	}
	// A stray argument is usually a flag gone wrong (--leader-elect false
	// leaves "false" here, and the flag true): refuse it.
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", c.Name, fs.Args())
		return ExitUsage
	}
	p, err := setup()
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			_, _ = fmt.Fprintf(stderr, "%s: %s\n", c.Name, line)
		}
		return ExitUsage
	}
	ctx := context.Background()
	if c.Signals != nil {
		ctx = c.Signals()
	} else {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
		defer stop()
	}
	if err := p.Run(ctx); err != nil {
		p.Failed(err)
		return ExitFailed
	}
	return ExitOK
}

// SlogProgram is the Program of a data-plane command that logs with log:
// run, whose error it reports as "<name> stopped".
func SlogProgram(log *slog.Logger, name string, run func(ctx context.Context) error) Program {
	return Program{Run: run, Failed: func(err error) { log.Error(name+" stopped", "error", err) }}
}
