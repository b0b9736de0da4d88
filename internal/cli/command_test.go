package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestCommandMain: each step of the shape ends in its exit code and its
// output, and the run gets the configured value and the signal context.
func TestCommandMain(t *testing.T) {
	type key struct{}
	signals := context.WithValue(context.Background(), key{}, "signals")
	for _, tc := range []struct {
		name       string
		args       []string
		setupErr   error
		runErr     error
		wantCode   int
		wantStdout string
		wantStderr string
		wantRun    bool
		wantFailed string
	}{
		{name: "the flags reach the run", args: []string{"--port=9"}, wantCode: ExitOK, wantRun: true},
		{name: "version, nothing set up", args: []string{"--version"}, wantCode: ExitOK, wantStdout: "slidegate test v1\n"},
		{name: "an unknown flag", args: []string{"--nope"}, wantCode: ExitUsage},
		{name: "a stray argument", args: []string{"--port", "9", "false"}, wantCode: ExitUsage,
			wantStderr: "test: unexpected arguments [\"false\"]\n"},
		{name: "a usage error, one problem a line", setupErr: errors.New("--port: too small\n--host: empty"), wantCode: ExitUsage,
			wantStderr: "test: --port: too small\ntest: --host: empty\n"},
		{name: "the run fails", runErr: errors.New("listen: in use"), wantCode: ExitFailed, wantRun: true, wantFailed: "listen: in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var port int
			ran, failed := false, ""
			c := Command{
				Name: "test", Version: "slidegate test v1", VersionUsage: "print the version",
				Flags: func(fs *flag.FlagSet) Setup {
					fs.IntVar(&port, "port", 1, "a port")
					return func() (Program, error) {
						if tc.setupErr != nil {
							return Program{}, tc.setupErr
						}
						return Program{
							Run: func(ctx context.Context) error {
								ran = true
								if ctx.Value(key{}) != "signals" {
									t.Error("the run did not get the Signals context")
								}
								if tc.args != nil && port != 9 {
									t.Errorf("port %d, want the flag's 9", port)
								}
								return tc.runErr
							},
							Failed: func(err error) { failed = err.Error() },
						}, nil
					}
				},
				Signals: func() context.Context { return signals },
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var stdout, stderr bytes.Buffer
			code := c.main(fs, tc.args, &stdout, &stderr)
			if code != tc.wantCode || stdout.String() != tc.wantStdout || stderr.String() != tc.wantStderr {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, stdout.String(), stderr.String(), tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
			if ran != tc.wantRun || failed != tc.wantFailed {
				t.Errorf("ran %v, failed %q; want %v, %q", ran, failed, tc.wantRun, tc.wantFailed)
			}
		})
	}
}

// TestCommandMainSignal: without Signals, SIGTERM ends the run's context,
// and the command exits ExitOK (the signal does not kill it).
func TestCommandMainSignal(t *testing.T) {
	c := Command{Name: "test", Flags: func(*flag.FlagSet) Setup {
		return func() (Program, error) {
			return Program{Run: func(ctx context.Context) error {
				if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Minute):
					return errors.New("SIGTERM did not end the context in a minute")
				}
			}, Failed: func(err error) { t.Error(err) }}, nil
		}
	}}
	if code := c.main(flag.NewFlagSet("test", flag.ContinueOnError), nil, io.Discard, io.Discard); code != ExitOK {
		t.Errorf("exit %d, want %d", code, ExitOK)
	}
}
