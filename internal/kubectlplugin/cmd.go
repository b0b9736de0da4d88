package kubectlplugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/slidegate/slidegate/internal/rlsconvert"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/version"
)

const usage = `kubectl slidegate: the policies' status, and why a client is limited, from the Kubernetes API.

Usage:
  kubectl slidegate status [-n NAMESPACE | -A] [POLICY] [-o json|yaml]
  kubectl slidegate why -n NAMESPACE POLICY (--header VALUE | --query VALUE | --claim VALUE | --ip IP | --global) [-o json|yaml]
  kubectl slidegate quota -n NAMESPACE POLICY (--header VALUE | --query VALUE | --claim VALUE | --ip IP | --global) [-o json|yaml]
  kubectl slidegate reset -n NAMESPACE POLICY (--header VALUE | --query VALUE | --claim VALUE | --ip IP | --global) [--reason TEXT]
  kubectl slidegate top -n NAMESPACE POLICY [--limit N] [-o json|yaml]
  kubectl slidegate convert -f CONFIG.yaml [-f ...] [-n NAMESPACE]
  kubectl slidegate completion
  kubectl slidegate version
  kubectl slidegate help

status lists the policies with what the controller reported: accepted,
ready, enforced, the reason of the first that is not (SidecarsOutdated,
ServiceBypassesSidecar, ...), enforced of matched pods and the sidecar
configuration revision; with one POLICY, each condition's message too. It
needs only get and list on ratelimitpolicies.

convert turns envoyproxy/ratelimit's configuration files into
RateLimitPolicies for slidegate's rate limit service (in NAMESPACE, default
"default"), written to stdout; what does not map, and what means something
else, is said in comments above them. It reads the files only (- is stdin).

why shows the client's live window under POLICY, read by a sidecar of the
policy's pods without changing it: admits in the window, limit, remaining,
the oldest admit's age, the exact retry time, and the other policies that
apply to the same request. The value is the client's as the user knows it
(an API key, a user id): the sidecar hashes it as it does for requests; it
is sent in a request header, so it stays out of the API server's audit log.
A value of - is read from stdin, so that it stays out of the shell history.

quota shows the client's quotas under POLICY (spec.quotas), read the same
way: per day or month, the requests counted in the current period, the
limit, what remains, the period in its time zone and when it resets.

reset empties the client's counters under POLICY: its window, its other
windows and its quotas' current periods, so that its next request is
counted as a new client's. A sidecar of the policy's pods does it in Redis;
the plugin records it as an Event on the policy (reason ClientReset) that
names you, the client's hashed key and --reason. It needs create on events
besides the permissions below (the ClusterRole slidegate-resetter), and
checks it before anything is reset. Other pods' sidecars may keep refusing
the client for up to 10 seconds, the time they serve a refusal they
remember without asking Redis.

top lists the clients (hashed keys) that POLICY answered 429 most often in
the last 5 to 10 minutes, merged over every ready sidecar of its pods; each
count is an upper bound, AT-LEAST a lower one (a bounded sketch per sidecar).

completion prints the script that kubectl (1.26 and later) runs to complete
the plugin's commands, flags, output formats and policy names: save it as an
executable named kubectl_complete-slidegate on PATH, beside the plugin.

It reaches the sidecars' debug port, on the pods' loopback address, through
a port-forward (as kubectl port-forward does). It needs create (and get) on
pods/portforward, get and list on pods and get on ratelimitpolicies in the
namespace: the ClusterRole slidegate-debugger grants them.

Flags:
`

// Env is what the command runs with: its input and output, and in tests a
// wrapper of the HTTP transport to the API server.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	WrapTransport  func(http.RoundTripper) http.RoundTripper
}

// Main runs `kubectl slidegate` with args (without the program name) and
// returns the exit code.
func (e Env) Main(ctx context.Context, args []string) int {
	if err := e.run(ctx, args); err != nil {
		fmt.Fprintln(e.Stderr, "error:", err)
		if errors.Is(err, ErrUsage) {
			return 2
		}
		return 1
	}
	return 0
}

// cmdArgs are the values of the flags.
type cmdArgs struct {
	o      WhyOptions
	output string
	limit  int
	global bool
	values [4]string // header, query, claim, ip
	// allNamespaces is status's -A.
	allNamespaces bool
	// files are convert's -f.
	files []string
	// reason is reset's --reason.
	reason     string
	overrides  clientcmd.ConfigOverrides
	kubeconfig string
}

// valueFlags name cmdArgs.values and the source each stands for.
var valueFlags = [4]struct{ flag, source, help string }{
	{"header", sidecarconfig.SourceHeader, "the client's value of the policy's header"},
	{"query", sidecarconfig.SourceQueryParameter, "the client's value of the policy's query parameter"},
	{"claim", sidecarconfig.SourceJWTClaim, "the client's value of the policy's bearer-token claim"},
	{"ip", sidecarconfig.SourceRemoteAddress, "the client's address"},
}

// flags are why's flags and kubectl's usual connection flags (-n,
// --context, --kubeconfig, ...), bound the way kubectl binds them.
func (e Env) flags(cmd string, a *cmdArgs) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kubectl slidegate "+cmd, pflag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	// run prints the usage: to stdout when asked for (--help), to stderr
	// with a usage error.
	fs.Usage = func() {}
	fs.StringVarP(&a.output, "output", "o", "", "output format: table (default), json or yaml")
	switch cmd {
	case "status":
		fs.BoolVarP(&a.allNamespaces, "all-namespaces", "A", false, "status: the policies of every namespace")
	case "convert":
		fs.StringArrayVarP(&a.files, "filename", "f", nil, "convert: an envoyproxy/ratelimit configuration file (- for stdin); repeatable")
	case "top":
		fs.IntVar(&a.limit, "limit", 10, "how many clients to list")
	default:
		for i, v := range valueFlags {
			fs.StringVar(&a.values[i], v.flag, "", "why, quota, reset: "+v.help)
		}
		fs.BoolVar(&a.global, "global", false, "why, quota, reset: the policy's one global key")
		fs.StringVar(&a.o.Pod, "pod", "", "why, quota, reset: ask this pod's sidecar (default: the first ready pod the policy selects)")
		fs.StringVar(&a.o.Method, "method", "", "why, quota, reset: the request's method (default: the policy's first, or GET)")
		fs.StringVar(&a.o.Path, "path", "", "why, quota, reset: the request's path (default: the policy's first path prefix, or /)")
		if cmd == "reset" {
			fs.StringVar(&a.reason, "reason", "", "reset: why, for the Event that records the reset")
		}
	}
	fs.StringVar(&a.kubeconfig, clientcmd.RecommendedConfigPathFlag, "", "path to the kubeconfig file")
	clientcmd.BindOverrideFlags(&a.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	return fs
}

// printUsage writes the usage and fs's flags to w.
func (e Env) printUsage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprint(w, usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(e.Stderr)
}

func (e Env) run(ctx context.Context, args []string) error {
	var a cmdArgs
	if len(args) == 1 && (args[0] == "version" || args[0] == "--version") {
		_, err := fmt.Fprintln(e.Stdout, "kubectl-slidegate", version.Get())
		return err
	}
	if len(args) > 0 && args[0] == "__complete" {
		return e.complete(ctx, args[1:])
	}
	if len(args) == 1 && args[0] == "completion" {
		_, err := fmt.Fprint(e.Stdout, completionScript)
		return err
	}
	if len(args) == 1 && (args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
		e.printUsage(e.Stdout, e.flags("why", &a))
		return nil
	}
	if len(args) == 0 || !slices.Contains(commands, args[0]) {
		e.printUsage(e.Stderr, e.flags("why", &a))
		return fmt.Errorf("%w: the commands are status, why, quota, reset, top, convert, completion and version", ErrUsage)
	}
	cmd := args[0]
	fs := e.flags(cmd, &a)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			e.printUsage(e.Stdout, fs)
			return nil
		}
		e.printUsage(e.Stderr, fs)
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if a.output != "" && a.output != "table" && a.output != "json" && a.output != "yaml" {
		return fmt.Errorf("%w: unknown output format %q (table, json or yaml)", ErrUsage, a.output)
	}
	switch cmd {
	case "status":
		return e.status(ctx, a, fs.Args())
	case "convert":
		return e.convert(a, fs.Args())
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: give exactly one POLICY", ErrUsage)
	}
	if cmd == "top" {
		return e.top(ctx, a, fs.Arg(0))
	}
	return e.why(ctx, a, fs, fs.Arg(0), cmd)
}

// commands are the commands that take flags.
var commands = []string{"status", "why", "quota", "reset", "top", "convert"}

// top runs `kubectl slidegate top POLICY`.
func (e Env) top(ctx context.Context, a cmdArgs, policy string) error {
	if a.limit < 1 {
		return fmt.Errorf("%w: --limit must be at least 1", ErrUsage)
	}
	c, ns, err := e.connect(a)
	if err != nil {
		return err
	}
	res, err := c.Top(ctx, ns, policy, a.limit)
	if err != nil {
		return err
	}
	return PrintTop(e.Stdout, res, a.output)
}

// why runs `kubectl slidegate why POLICY` with the one key flag fs has set;
// cmd "quota" asks the same and prints the quotas, "reset" empties the
// client's counters.
func (e Env) why(ctx context.Context, a cmdArgs, fs *pflag.FlagSet, policy, cmd string) error {
	o := a.o
	o.Policy = policy
	n := 0
	if a.global {
		n++
		o.Source = sidecarconfig.SourceGlobal
	}
	for i, v := range valueFlags {
		if fs.Changed(v.flag) {
			n++
			o.Source, o.Value = v.source, a.values[i]
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: give exactly one of --header, --query, --claim, --ip, --global", ErrUsage)
	}
	if o.Value == "-" {
		// A credential typed on the command line stays in the shell's
		// history; from stdin it does not.
		v, err := readValue(e.Stdin)
		if err != nil {
			return err
		}
		o.Value = v
	}
	c, ns, err := e.connect(a)
	if err != nil {
		return err
	}
	o.Namespace = ns
	if cmd == "reset" {
		res, err := c.Reset(ctx, o, a.reason)
		if res != nil {
			if perr := PrintReset(e.Stdout, res, a.output); perr != nil && err == nil {
				err = perr
			}
		}
		return err
	}
	res, err := c.Why(ctx, o)
	if err != nil {
		return err
	}
	if cmd == "quota" {
		q, err := Quotas(res)
		if err != nil {
			return err
		}
		return PrintQuota(e.Stdout, q, a.output)
	}
	return PrintWhy(e.Stdout, res, a.output)
}

// status runs `kubectl slidegate status [POLICY]`.
func (e Env) status(ctx context.Context, a cmdArgs, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("%w: give at most one POLICY", ErrUsage)
	}
	if a.allNamespaces && len(args) == 1 {
		return fmt.Errorf("%w: a POLICY is in one namespace: give -n, not -A", ErrUsage)
	}
	c, ns, err := e.connect(a)
	if err != nil {
		return err
	}
	if a.allNamespaces {
		ns = ""
	}
	name := ""
	if len(args) == 1 {
		name = args[0]
	}
	res, err := c.Status(ctx, ns, name)
	if err != nil {
		return err
	}
	return PrintStatus(e.Stdout, res, a.output)
}

// convert runs `kubectl slidegate convert -f FILE...`: the policies of
// every file, one YAML stream each, and a line on stderr per file.
func (e Env) convert(a cmdArgs, args []string) error {
	if len(args) > 0 || len(a.files) == 0 {
		return fmt.Errorf("%w: give the configuration files with -f (- for stdin)", ErrUsage)
	}
	ns := a.overrides.Context.Namespace
	if ns == "" {
		ns = "default"
	}
	for i, f := range a.files {
		var in []byte
		var err error
		if f == "-" {
			if e.Stdin == nil {
				return fmt.Errorf("%w: no stdin to read the configuration from", ErrUsage)
			}
			in, err = io.ReadAll(io.LimitReader(e.Stdin, 16<<20))
		} else {
			in, err = os.ReadFile(f)
		}
		if err != nil {
			return err
		}
		r, err := rlsconvert.Convert(in, ns)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		out, err := r.YAML()
		if err != nil {
			return err
		}
		if i > 0 {
			out = append([]byte("---\n"), out...)
		}
		if _, err := e.Stdout.Write(out); err != nil {
			return err
		}
		skipped := 0
		for _, n := range r.Notes {
			if n.Policy == "" {
				skipped++
			}
		}
		fmt.Fprintf(e.Stderr, "%s: %d policies; %d rate limits not converted, %d notes (in the comments)\n", f, len(r.Policies), skipped, len(r.Notes))
	}
	return nil
}

// connect loads the kubeconfig as kubectl does (flags, $KUBECONFIG,
// ~/.kube/config) and returns a client and the namespace to use.
func (e Env) connect(a cmdArgs) (*Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = a.kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &a.overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	if e.WrapTransport != nil {
		cfg.Wrap(e.WrapTransport)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", err
	}
	c, err := NewClient(cfg)
	return c, ns, err
}

// readValue reads the client value from the first line of r.
func readValue(r io.Reader) (string, error) {
	if r == nil {
		return "", fmt.Errorf("%w: no stdin to read the value from", ErrUsage)
	}
	line, err := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading the value from stdin: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("%w: the value read from stdin is empty", ErrUsage)
	}
	return line, nil
}

// completionScript is kubectl_complete-slidegate: kubectl runs it with the
// words after "kubectl slidegate", the last one being completed.
const completionScript = `#!/usr/bin/env sh
# kubectl_complete-slidegate: completion of kubectl slidegate (kubectl 1.26+).
exec kubectl slidegate __complete "$@"
`

// Directives of Cobra's completion protocol, which kubectl reads from a
// plugin's completion: 4 completes nothing but the candidates given; 0 lets
// the shell complete file names too.
const (
	completeNoFiles = 4
	completeFiles   = 0
)

// complete answers `kubectl slidegate __complete WORDS... WORD` in Cobra's
// protocol: the candidates for WORD, one a line, then ":" and a directive.
// Policy names come from the API server, in the namespace the words name
// (-n) or the kubeconfig's; when it cannot be asked, there are none.
func (e Env) complete(ctx context.Context, args []string) error {
	word := ""
	if len(args) > 0 {
		word, args = args[len(args)-1], args[:len(args)-1]
	}
	directive := completeNoFiles
	var cands []string
	switch {
	case len(args) == 0:
		cands = []string{"status", "why", "quota", "reset", "top", "convert", "completion", "version", "help"}
	case slices.Contains(commands, args[0]):
		cmd := args[0]
		var a cmdArgs
		fs := e.flags(cmd, &a)
		fs.SetOutput(io.Discard)
		prev := args[len(args)-1]
		switch {
		case strings.HasPrefix(word, "-"):
			fs.VisitAll(func(f *pflag.Flag) {
				cands = append(cands, "--"+f.Name)
				if f.Shorthand != "" {
					cands = append(cands, "-"+f.Shorthand)
				}
			})
		case prev == "-o" || prev == "--output":
			cands = []string{"table", "json", "yaml"}
		case prev == "-f" || prev == "--filename":
			directive = completeFiles
		case takesValue(fs, prev):
			// A value that cannot be listed here (a namespace, a context).
		case cmd != "convert":
			cands = e.policyNames(ctx, fs, &a, args[1:])
		}
	}
	for _, c := range cands {
		if strings.HasPrefix(c, word) {
			if _, err := fmt.Fprintln(e.Stdout, c); err != nil {
				return err
			}
		}
	}
	_, err := fmt.Fprintf(e.Stdout, ":%d\n", directive)
	return err
}

// policyNames are the candidates for a command's POLICY argument after
// the words args, parsed by fs into a: the names of the policies of the
// namespace they name; none when a POLICY is given already, across all
// namespaces (names repeat), or when the API server cannot be asked.
func (e Env) policyNames(ctx context.Context, fs *pflag.FlagSet, a *cmdArgs, args []string) []string {
	fs.ParseErrorsAllowlist.UnknownFlags = true
	if fs.Parse(args) != nil || fs.NArg() > 0 || a.allNamespaces {
		return nil
	}
	c, ns, err := e.connect(*a)
	if err != nil {
		return nil
	}
	sts, err := c.Status(ctx, ns, "")
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(sts))
	for _, st := range sts {
		names = append(names, st.Name)
	}
	return names
}

// takesValue reports whether word is a flag of fs, without "=", that takes
// the next word as its value.
func takesValue(fs *pflag.FlagSet, word string) bool {
	if !strings.HasPrefix(word, "-") || strings.Contains(word, "=") {
		return false
	}
	var f *pflag.Flag
	if name, ok := strings.CutPrefix(word, "--"); ok {
		f = fs.Lookup(name)
	} else {
		f = fs.ShorthandLookup(strings.TrimPrefix(word, "-"))
	}
	return f != nil && f.NoOptDefVal == ""
}
