package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/render"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The demo's fixed facts, from config/samples.
const (
	Namespace     = "slidegate-demo"
	AppDeployment = "demo-app"
	UserPolicy    = "per-user"
	UserHeader    = "X-User-ID"
	// RequestsPerClient is what each client sends in a round: more than the
	// per-user limit, so every client is limited.
	RequestsPerClient = 8
	// RaisedLimit is the per-user limit after the edit.
	RaisedLimit = 8
)

// Clients of the first round; NewClient arrives after the limit is raised.
var (
	Clients   = []string{"alice", "bob", "carol"}
	NewClient = "dave"
)

// Counts are one client's answers in a round.
type Counts struct {
	Admitted, Rejected int
	// RejectedBy counts 429s by the policy named in RateLimit-Policy.
	RejectedBy map[string]int
}

// KeyTTL is one Redis key and its remaining time to live.
type KeyTTL struct {
	Key string
	TTL time.Duration
}

// PolicyStatus is a policy's status as `kubectl get rlp` shows it.
type PolicyStatus struct {
	Name                      string
	Ready, Accepted, Enforced metav1.ConditionStatus
	MatchedPods, EnforcedPods int32
	ObservedGeneration        int64
	Generation                int64
}

// Result is everything the demo shows, for the e2e test to assert.
type Result struct {
	Limit         int
	Round1        map[string]Counts
	UpstreamSeen  int64
	Sample429     *http.Response
	Sample429Body string
	RedisKeys     []KeyTTL
	ReloadTook    time.Duration
	// RestartedOnReload is true if the sidecar process changed or died.
	RestartedOnReload bool
	// Metrics are the non-zero slidegate_sidecar_requests_total series
	// after the first round.
	Metrics  []string
	Round2   Counts
	Policies []PolicyStatus
	Injected *corev1.Pod
	// Tokens is the token-limited step (tokens.go).
	Tokens *TokenResult
}

// Options of Run.
type Options struct {
	ManagerBin, SidecarBin string
	Out                    io.Writer
}

// Run is the whole demo: it starts everything, applies config/samples,
// creates the app's pod through the API server (the webhook injects the
// sidecar), runs the sidecar as the pod spec says, sends traffic, raises a
// limit, and prints what happened. It stops everything it started.
func Run(ctx context.Context, o Options) (*Result, error) {
	step := 0
	logf := func(format string, a ...any) {
		step++
		fmt.Fprintf(o.Out, "==> [%d] %s\n", step, fmt.Sprintf(format, a...))
	}
	c, err := StartCluster(ctx, o.ManagerBin, logf)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res := &Result{Round1: map[string]Counts{}}

	root, err := testsupport.RepoRoot()
	if err != nil {
		return nil, err
	}
	logf("kubectl apply --server-side -k config/samples")
	out, err := c.Kubectl(ctx, "apply", "--server-side", "-k", filepath.Join(root, "config", "samples"))
	if err != nil {
		return nil, err
	}
	fmt.Fprint(o.Out, indent(out))

	logf("creating the app's pod from Deployment %s through the API server (no kubelet here); the webhook injects the sidecar", AppDeployment)
	pod, err := createPodFromDeployment(ctx, c.Client, nil)
	if err != nil {
		return nil, err
	}
	res.Injected = pod
	fmt.Fprintf(o.Out, "    pod %s: init containers %v, annotation %s=%s\n", pod.Name, containerNames(pod.Spec.InitContainers),
		v1alpha1.InjectedAnnotation, pod.Annotations[v1alpha1.InjectedAnnotation])

	logf("waiting for the controller to render ConfigMap %s", sidecarconfig.ConfigMapName)
	if err := waitRendered(ctx, c.Client); err != nil {
		return nil, err
	}

	var seen atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		_, _ = io.WriteString(w, "hello from the demo app\n")
	}))
	defer upstream.Close()
	sc, err := c.StartSidecar(ctx, o.SidecarBin, pod, upstream.URL, logf)
	if err != nil {
		return nil, err
	}
	// The kubelet keeps ConfigMap volumes in sync; so do we, until the end.
	c.KeepSynced(sc, Namespace)

	var policy v1alpha1.RateLimitPolicy
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: UserPolicy}, &policy); err != nil {
		return nil, err
	}
	res.Limit = int(policy.Spec.Limit)
	logf("traffic: %d requests each from %s (header %s), policy %s allows %d per %s", RequestsPerClient, strings.Join(Clients, ", "),
		UserHeader, UserPolicy, res.Limit, policy.Spec.Window)
	for _, name := range Clients {
		counts, sample, err := send(ctx, sc.URL, name, RequestsPerClient)
		if err != nil {
			return nil, err
		}
		res.Round1[name] = counts
		if res.Sample429 == nil && sample != nil {
			res.Sample429, res.Sample429Body = sample.resp, sample.body
		}
	}
	res.UpstreamSeen = seen.Load()
	printCounts(o.Out, res.Round1)
	if res.Metrics, err = metricLines(ctx, sc.AdminURL, "slidegate_sidecar_requests_total"); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Out, "    the sidecar's decisions per policy (slidegate_sidecar_requests_total, non-zero):\n")
	for _, l := range res.Metrics {
		fmt.Fprintf(o.Out, "      %s\n", l)
	}
	fmt.Fprintf(o.Out, "    the app saw %d requests: exactly the admitted ones\n", res.UpstreamSeen)
	if res.Sample429 != nil {
		fmt.Fprintf(o.Out, "    one 429, in full:\n")
		dump, _ := httputil.DumpResponse(res.Sample429, false)
		fmt.Fprint(o.Out, indent(string(dump)+res.Sample429Body))
	}

	logf("Redis keys and their TTLs (each key expires by itself)")
	if res.RedisKeys, err = redisKeys(c.Redis); err != nil {
		return nil, err
	}
	for _, k := range res.RedisKeys {
		fmt.Fprintf(o.Out, "    %-60s ttl %s\n", k.Key, k.TTL)
	}

	logf("raising %s's limit from %d to %d with a patch; the sidecar reloads it without a restart", UserPolicy, res.Limit, RaisedLimit)
	before, err := metricValue(ctx, sc.AdminURL, `slidegate_sidecar_config_reloads_total{result="success"}`)
	if err != nil {
		return nil, err
	}
	pid := sc.Pid()
	start := time.Now()
	patch := client.MergeFrom(policy.DeepCopy())
	policy.Spec.Limit = RaisedLimit
	if err := c.Client.Patch(ctx, &policy, patch); err != nil {
		return nil, err
	}
	if err := poll(ctx, func() bool {
		v, err := metricValue(ctx, sc.AdminURL, `slidegate_sidecar_config_reloads_total{result="success"}`)
		return err == nil && v > before
	}); err != nil {
		return nil, fmt.Errorf("the sidecar never reloaded: %w", err)
	}
	res.ReloadTook = time.Since(start)
	res.RestartedOnReload = sc.Pid() != pid || !sc.Running()
	fmt.Fprintf(o.Out, "    the sidecar (pid %d, still running: %v) loaded the new config %s after the patch\n", sc.Pid(), sc.Running(), res.ReloadTook.Round(time.Millisecond))
	if res.Round2, _, err = send(ctx, sc.URL, NewClient, RequestsPerClient+2); err != nil {
		return nil, err
	}
	printCounts(o.Out, map[string]Counts{NewClient: res.Round2})

	if res.Tokens, err = runTokens(ctx, c, o, logf); err != nil {
		return nil, err
	}

	logf("kubectl get rlp -n %s -o wide", Namespace)
	if err := poll(ctx, func() bool {
		res.Policies, err = statuses(ctx, c.Client)
		return err == nil && allReady(res.Policies)
	}); err != nil {
		return nil, fmt.Errorf("policies not Ready: %w", err)
	}
	if out, err = c.Kubectl(ctx, "get", "rlp", "-n", Namespace, "-o", "wide"); err != nil {
		return nil, err
	}
	fmt.Fprint(o.Out, indent(out))
	logf("done; stopping the sidecar, the manager, redis-server and the control plane")
	return res, nil
}

// waitRendered waits until the rendered ConfigMap holds every policy of
// the namespace. Not only there: the controller renders as the policies
// arrive, and a sidecar started on an earlier render serves its first
// requests without the later policies (seen: alice admitted 6). A policy's
// status.revision is the hash of its part of the document, so the document
// holds every policy when each part hashes to it.
func waitRendered(ctx context.Context, c client.Client) error {
	if err := poll(ctx, func() bool {
		var cm corev1.ConfigMap
		var list v1alpha1.RateLimitPolicyList
		if c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: sidecarconfig.ConfigMapName}, &cm) != nil ||
			c.List(ctx, &list, client.InNamespace(Namespace)) != nil || len(list.Items) == 0 {
			return false
		}
		cfg, err := sidecarconfig.Parse([]byte(cm.Data[sidecarconfig.FileName]))
		if err != nil {
			return false
		}
		revs, err := render.PolicyRevisions(cfg)
		if err != nil {
			return false
		}
		for _, p := range list.Items {
			if p.Status.Revision == "" || p.Status.Revision != revs[p.Name] {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("the ConfigMap never held every policy: %w", err)
	}
	return nil
}

// createPodFromDeployment creates a pod of Deployment AppDeployment through
// the API server. With labels, the pod has those instead of the template's
// and is named after labels["app"]: the same pod spec standing for another
// app (the model server of tokens.go).
func createPodFromDeployment(ctx context.Context, c client.Client, labels map[string]string) (*corev1.Pod, error) {
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: AppDeployment}, &d); err != nil {
		return nil, err
	}
	name := AppDeployment
	if labels == nil {
		labels = d.Spec.Template.Labels
	} else if labels["app"] != "" {
		name = labels["app"]
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: name + "-",
			Namespace:    Namespace,
			Labels:       labels,
			Annotations:  d.Spec.Template.Annotations,
		},
		Spec: d.Spec.Template.Spec,
	}
	// The webhook reads policies from the manager's cache; retry briefly
	// until it has seen them (a ReplicaSet would retry the same way).
	var created *corev1.Pod
	err := poll(ctx, func() bool {
		p := pod.DeepCopy()
		if err := c.Create(ctx, p); err != nil {
			return false
		}
		if _, ok := p.Annotations[v1alpha1.InjectedAnnotation]; ok {
			created = p
			return true
		}
		_ = c.Delete(ctx, p)
		return false
	})
	return created, err
}

type sample struct {
	resp *http.Response
	body string
}

func send(ctx context.Context, url, user string, n int) (Counts, *sample, error) {
	counts := Counts{RejectedBy: map[string]int{}}
	var first *sample
	for range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/", nil)
		if err != nil {
			return counts, nil, err
		}
		req.Header.Set(UserHeader, user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return counts, nil, err
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			counts.Admitted++
		case http.StatusTooManyRequests:
			counts.Rejected++
			name, _, _ := strings.Cut(resp.Header.Get("RateLimit-Policy"), ";")
			counts.RejectedBy[strings.Trim(name, `"`)]++
			if first == nil {
				first = &sample{resp: resp, body: string(body)}
			}
		default:
			return counts, nil, fmt.Errorf("unexpected %s for %s: %s", resp.Status, user, body)
		}
	}
	return counts, first, nil
}

func redisKeys(r *testsupport.Redis) ([]KeyTTL, error) {
	keys, err := r.Do("KEYS", "*")
	if err != nil {
		return nil, err
	}
	var out []KeyTTL
	for _, k := range strings.Split(keys, "\n") {
		if k == "" {
			continue
		}
		ms, err := r.Do("PTTL", k)
		if err != nil {
			return nil, err
		}
		n, _ := strconv.Atoi(ms)
		out = append(out, KeyTTL{Key: k, TTL: time.Duration(n) * time.Millisecond})
	}
	slices.SortFunc(out, func(a, b KeyTTL) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// metricValue reads one sample from the sidecar's /metrics (0 when absent).
func metricValue(ctx context.Context, adminURL, series string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, sc.Err()
}

// metricLines returns the non-zero samples of one metric family.
func metricLines(ctx context.Context, adminURL, family string) ([]string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, family+"{") && !strings.HasSuffix(l, " 0") {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

func statuses(ctx context.Context, c client.Client) ([]PolicyStatus, error) {
	var list v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &list, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	var out []PolicyStatus
	for _, p := range list.Items {
		cond := func(t v1alpha1.ConditionType) metav1.ConditionStatus {
			for _, c := range p.Status.Conditions {
				if c.Type == string(t) {
					return c.Status
				}
			}
			return metav1.ConditionUnknown
		}
		out = append(out, PolicyStatus{
			Name: p.Name, Ready: cond(v1alpha1.ConditionReady), Accepted: cond(v1alpha1.ConditionAccepted), Enforced: cond(v1alpha1.ConditionEnforced),
			MatchedPods: p.Status.MatchedPods, EnforcedPods: p.Status.EnforcedPods,
			ObservedGeneration: p.Status.ObservedGeneration, Generation: p.Generation,
		})
	}
	slices.SortFunc(out, func(a, b PolicyStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func allReady(ps []PolicyStatus) bool {
	for _, p := range ps {
		if p.Ready != metav1.ConditionTrue || p.Enforced != metav1.ConditionTrue || p.ObservedGeneration != p.Generation {
			return false
		}
	}
	return len(ps) > 0
}

func printCounts(w io.Writer, m map[string]Counts) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    CLIENT\tADMITTED\tREJECTED\tREJECTED BY")
	for _, name := range slices.Sorted(maps.Keys(m)) {
		c := m[name]
		var by []string
		for _, p := range slices.Sorted(maps.Keys(c.RejectedBy)) {
			by = append(by, fmt.Sprintf("%s ×%d", p, c.RejectedBy[p]))
		}
		fmt.Fprintf(tw, "    %s\t%d\t%d\t%s\n", name, c.Admitted, c.Rejected, strings.Join(by, ", "))
	}
	_ = tw.Flush()
}

func containerNames(cs []corev1.Container) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("      " + strings.TrimRight(l, "\r") + "\n")
	}
	return b.String()
}

// pollTimeout bounds every wait of the flow: generous for a loaded machine,
// short enough that a stuck step fails the demo instead of hanging it.
const pollTimeout = 30 * time.Second

func poll(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// Main is `make demo`: it runs the flow and prints it; the exit code says
// whether the demo showed what it should.
func Main(managerBin, sidecarBin string) int {
	start := time.Now()
	ctx := context.Background()
	res, err := Run(ctx, Options{ManagerBin: managerBin, SidecarBin: sidecarBin, Out: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		return 1
	}
	if problems := Check(res); len(problems) > 0 {
		fmt.Fprintln(os.Stderr, "demo ran, but did not show what it should:\n  "+strings.Join(problems, "\n  "))
		return 1
	}
	fmt.Printf("==> all checks passed in %s\n", time.Since(start).Round(time.Second))
	return 0
}

// Check compares the result with what the samples promise; the e2e test and
// the demo share it, so the demo never prints numbers the tests do not hold.
func Check(r *Result) []string {
	var p []string
	bad := func(format string, a ...any) { p = append(p, fmt.Sprintf(format, a...)) }
	admitted := 0
	for _, name := range Clients {
		c := r.Round1[name]
		admitted += c.Admitted
		if c.Admitted != r.Limit || c.Rejected != RequestsPerClient-r.Limit || c.RejectedBy[UserPolicy] != c.Rejected {
			bad("%s: admitted %d, rejected %d %v; want %d admitted and %d rejected by %s", name, c.Admitted, c.Rejected, c.RejectedBy, r.Limit, RequestsPerClient-r.Limit, UserPolicy)
		}
	}
	if r.UpstreamSeen != int64(admitted) {
		bad("the app saw %d requests, want the %d admitted", r.UpstreamSeen, admitted)
	}
	if r.Sample429 == nil {
		bad("no 429 response to show")
	} else {
		for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
			if r.Sample429.Header.Get(h) == "" {
				bad("the 429 response lacks %s", h)
			}
		}
		// The policy is named where the IETF draft puts it, in the
		// RateLimit fields; the body says when to retry and nothing of the
		// namespace (docs/security.md).
		if !strings.HasPrefix(r.Sample429.Header.Get("RateLimit"), `"`+UserPolicy+`";`) {
			bad("the 429's RateLimit field does not name the policy: %q", r.Sample429.Header.Get("RateLimit"))
		}
		if !strings.Contains(r.Sample429Body, "retry in") || strings.Contains(r.Sample429Body, Namespace) {
			bad("the 429 body says more or less than when to retry: %q", r.Sample429Body)
		}
	}
	if len(r.RedisKeys) == 0 {
		bad("no Redis keys")
	}
	for _, k := range r.RedisKeys {
		if k.TTL <= 0 {
			bad("Redis key %s has no TTL (%s)", k.Key, k.TTL)
		}
	}
	if r.RestartedOnReload {
		bad("the sidecar process was restarted or died during the reload")
	}
	dryRun := false
	for _, l := range r.Metrics {
		dryRun = dryRun || strings.Contains(l, `decision="dry_run_rejected"`)
	}
	if !dryRun {
		bad("no dry-run would-be rejection in the sidecar's metrics: %v", r.Metrics)
	}
	if r.Round2.Admitted != RaisedLimit || r.Round2.Rejected != 2 {
		bad("after raising the limit to %d, %s got %d admitted and %d rejected; want %d and 2", RaisedLimit, NewClient, r.Round2.Admitted, r.Round2.Rejected, RaisedLimit)
	}
	for _, s := range r.Policies {
		if s.Ready != metav1.ConditionTrue || s.Accepted != metav1.ConditionTrue || s.Enforced != metav1.ConditionTrue || s.MatchedPods != 1 || s.EnforcedPods != 1 {
			bad("policy %s: Ready=%s Accepted=%s Enforced=%s matched=%d enforced=%d; want True/True/True 1/1", s.Name, s.Ready, s.Accepted, s.Enforced, s.MatchedPods, s.EnforcedPods)
		}
	}
	checkTokens(r.Tokens, bad)
	return p
}
