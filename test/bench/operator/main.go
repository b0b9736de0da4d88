// Command operator benchmarks the RateLimitPolicy controller at scale and
// writes a Markdown section ("## Operator") for the benchmark report:
//
//	KUBEBUILDER_ASSETS="$(hack/envtest.sh)" go run ./test/bench/operator -out docs/bench/operator.md
//
// For each number of policies (1,000 and 10,000, ten per namespace) it
// starts an envtest control plane and two manager processes against it at
// the same time: the real controller, set up as cmd/manager sets it up, and
// a baseline that only caches the same objects (see setupBaseline). Both are
// this program run again with -role, so that each one's RSS and CPU are its
// own, not the load generator's; running them together puts the machine's
// noise on both, and the ratios are what to read. It creates the policies
// as fast as a few clients can and measures the time until every one is
// Ready and the API writes per policy; then churns pods that the policies
// select and counts the writes per pod event; then adds and deletes one
// policy per namespace. A run of both sizes takes about five minutes on two
// cores.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/inject"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

var scheme = k8sruntime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
}

// credentials is the manager's Redis credentials Secret (--redis-secret-name
// in the manager's namespace): set, so that the mirror into every namespace
// is part of the measure.
var credentials = client.ObjectKey{Namespace: "slidegate-system", Name: "slidegate-redis"}

// options are the flags of a run.
type options struct {
	sizes        []int
	perNamespace int
	clients      int
	churnNS      []int // per size; the last one for the sizes after
	changeNS     int
	churnPods    int
	interleaved  bool
	events       bool
	quiet        time.Duration
	phaseTimeout time.Duration
}

func main() {
	out := flag.String("out", "", "write the Markdown section to this file (default: stdout)")
	sizes := flag.String("policies", "1000,10000", "numbers of policies to measure")
	var o options
	flag.IntVar(&o.perNamespace, "per-namespace", 10, "policies per namespace")
	flag.IntVar(&o.clients, "clients", 8, "concurrent clients creating the objects")
	churnNS := flag.String("churn-namespaces", "100,20", "namespaces that get the pod churn, per number of policies (at most all of them; the last value for the numbers after)")
	flag.IntVar(&o.changeNS, "change-namespaces", 20, "namespaces that get one more policy, then lose it")
	flag.IntVar(&o.churnPods, "churn-pods", 2, "pods created, then deleted, in each churn namespace")
	order := flag.String("order", "interleaved", "creation order of the policies: interleaved (the first policy of every namespace, then the second...) or burst (namespace by namespace)")
	flag.DurationVar(&o.quiet, "quiet", 2*time.Second, "no write and no reconcile for this long ends a phase")
	flag.DurationVar(&o.phaseTimeout, "phase-timeout", 4*time.Minute, "give up on a phase after this long")
	role := flag.String("role", "", "internal: run as a manager process (controller or baseline)")
	creds := flag.String("credentials", "", "internal: the manager's credentials Secret, namespace/name")
	flag.BoolVar(&o.events, "events", true, "experiments: false runs the controller without its event recorder")
	flag.Parse()

	switch *order {
	case "interleaved", "burst":
		o.interleaved = *order == "interleaved"
	default:
		fatalf("bad -order %q: interleaved or burst", *order)
	}
	if *role != "" {
		if err := runManager(*role, *creds, o.events); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if o.sizes, err = ints(*sizes); err != nil || slices.ContainsFunc(o.sizes, func(n int) bool { return n < o.perNamespace || n%o.perNamespace != 0 }) {
		fatalf("bad -policies %q: each a multiple of -per-namespace", *sizes)
	}
	if o.churnNS, err = ints(*churnNS); err != nil || slices.Min(o.churnNS) < 1 || o.changeNS < 1 {
		fatalf("bad -churn-namespaces %q or -change-namespaces %d", *churnNS, o.changeNS)
	}
	// This process's client and cache log nothing worth reading; the
	// managers log to files (kept when a run fails).
	logf.SetLogger(logr.Discard())
	md, err := run(o)
	if err != nil {
		fatalf("%v", err)
	}
	if *out == "" {
		_, _ = os.Stdout.WriteString(md)
		return
	}
	if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		fatalf("%v", err)
	}
}

// ints parses a comma-separated list of numbers.
func ints(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "operator bench: "+format+"\n", args...)
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "operator bench: "+format+"\n", args...)
}

// result is the measure of one number of policies.
type result struct {
	policies, namespaces int
	// churnNS and changeNS: the first namespaces, that get the pod churn
	// and the policy change.
	churnNS, changeNS int
	podEvents         int
	// created: every create returned; ready: every policy Ready (the
	// controller); cached: the baseline's cache holds every policy. All
	// from the first create.
	created, ready, cached time.Duration
	// churnUp and churnDown: the rounds of pod creates (deletes), each
	// until the controller's status counts the round, added up.
	churnUp, churnDown time.Duration
	// Each manager's stats at the start and end of the phases.
	ctrl, base [phases]stats
	// events: Events in the cluster at the same moments.
	events [phases]int
}

// The moments a result's stats are taken: before the first create, and
// at the end of each phase, once the controller is quiet.
const (
	start   = iota
	created // (a), (b): policies created, all Ready
	churned // (c): pods created and deleted
	added   // one policy added to, then deleted from, each churn namespace
	phases
)

func run(o options) (string, error) {
	started := time.Now()
	loadBefore := loadAvg()
	var results []*result
	for i, n := range o.sizes {
		progress("%d policies", n)
		r, err := measure(o, n, o.churnNS[min(i, len(o.churnNS)-1)])
		if err != nil {
			return "", fmt.Errorf("%d policies: %w", n, err)
		}
		results = append(results, r)
	}
	return report(o, results, time.Since(started), loadBefore, loadAvg()), nil
}

// measure runs one number of policies on a control plane of its own, so
// that every size starts from an empty etcd.
func measure(o options, n, churnNS int) (*result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &result{policies: n, namespaces: n / o.perNamespace}
	r.churnNS, r.changeNS = min(churnNS, r.namespaces), min(o.changeNS, r.namespaces)
	r.podEvents = 2 * r.churnNS * o.churnPods // a create and a delete each

	dir, err := os.MkdirTemp("", "slidegate-bench-operator-")
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if keep {
			progress("manager logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	env, err := testsupport.NewEnvironment()
	if err != nil {
		return nil, testsupport.EnvtestUnavailable(err)
	}
	env.ErrorIfCRDPathMissing = true
	if _, err := env.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() { _ = env.Stop() }()

	s := &sizeRun{o: o, r: r}
	kubeconfig, err := s.seed(ctx, env, dir)
	if err != nil {
		return nil, err
	}
	// The managers, and this process's own cache of the policies, to see
	// their status without a GET per policy.
	if s.ctrl, err = startManager(dir, roleController, kubeconfig, o.events); err != nil {
		keep = true
		return nil, err
	}
	defer s.ctrl.stop()
	if s.base, err = startManager(dir, roleBaseline, kubeconfig, o.events); err != nil {
		keep = true
		return nil, err
	}
	defer s.base.stop()
	if s.watch, err = cache.New(env.Config, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()}); err != nil {
		return nil, err
	}
	for _, obj := range []client.Object{&v1alpha1.RateLimitPolicy{}, &corev1.ConfigMap{}} {
		if _, err := s.watch.GetInformer(ctx, obj, cache.BlockUntilSynced(false)); err != nil {
			return nil, err
		}
	}
	go func() { _ = s.watch.Start(ctx) }()
	if !s.watch.WaitForCacheSync(ctx) {
		return nil, errors.New("the bench's policy cache did not sync")
	}

	if err := s.phases(ctx); err != nil {
		keep = true
		return nil, err
	}
	return r, nil
}

// sizeRun is the measure of one number of policies under way.
type sizeRun struct {
	o          options
	r          *result
	k          client.Client // to the API server, no cache
	watch      cache.Cache   // the policies and ConfigMaps
	ctrl, base *managerProc
}

// seed creates what exists before the policies: the manager's namespace
// and credentials, and the namespaces, opted in to injection. It returns
// the path of an admin kubeconfig for the managers.
func (s *sizeRun) seed(ctx context.Context, env *envtest.Environment, dir string) (string, error) {
	env.Config.QPS = -1 // no client-side rate limit: the load is what the API server takes
	admin, err := env.AddUser(envtest.User{Name: "slidegate-bench", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return "", err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return "", err
	}
	if s.k, err = client.New(env.Config, client.Options{Scheme: scheme}); err != nil {
		return "", err
	}
	if err := s.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: credentials.Namespace}}); err != nil {
		return "", err
	}
	if err := s.k.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: credentials.Name, Namespace: credentials.Namespace},
		Data:       map[string][]byte{redisconn.SecretUsernameKey: []byte("sidecar"), redisconn.SecretPasswordKey: []byte("s3cret")},
	}); err != nil {
		return "", err
	}
	err = parallel(ctx, s.o.clients, s.r.namespaces, func(ctx context.Context, i int) error {
		return create(ctx, s.k, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: namespace(i), Labels: map[string]string{v1alpha1.InjectionLabel: v1alpha1.InjectionEnabled},
		}})
	})
	if err != nil {
		return "", fmt.Errorf("creating the namespaces: %w", err)
	}
	return kubeconfig, nil
}

// phases runs the phases, each until the controller is quiet, and takes
// the stats at their ends.
func (s *sizeRun) phases(ctx context.Context) error {
	if err := s.snapshot(ctx, start); err != nil {
		return err
	}
	for _, ph := range []struct {
		at  int
		run func(context.Context) error
	}{{created, s.createPolicies}, {churned, s.podChurn}, {added, s.policyChurn}} {
		if err := ph.run(ctx); err != nil {
			return err
		}
		if err := s.ctrl.waitQuiet(ctx, s.o.quiet, s.o.phaseTimeout); err != nil {
			return err
		}
		if err := s.snapshot(ctx, ph.at); err != nil {
			return err
		}
	}
	return nil
}

func (s *sizeRun) snapshot(ctx context.Context, at int) error {
	var err error
	if s.r.ctrl[at], err = s.ctrl.stats(); err != nil {
		return err
	}
	if s.r.base[at], err = s.base.stats(); err != nil {
		return err
	}
	s.r.events[at], err = countEvents(ctx, s.k)
	return err
}

// createPolicies is (a) and (b): it creates the policies, and returns once
// all are Ready and the baseline's cache holds them all.
func (s *sizeRun) createPolicies(ctx context.Context) error {
	o, r := s.o, s.r
	progress("creating %d policies in %d namespaces", r.policies, r.namespaces)
	t0 := time.Now()
	var createErr atomic.Pointer[error]
	var createdIn atomic.Int64
	go func() {
		err := parallel(ctx, o.clients, r.policies, func(ctx context.Context, i int) error {
			ns, j := i/o.perNamespace, i%o.perNamespace
			if o.interleaved {
				ns, j = i%r.namespaces, i/r.namespaces
			}
			return create(ctx, s.k, policy(namespace(ns), fmt.Sprintf("p%d", j), j))
		})
		if err != nil {
			createErr.Store(&err)
		}
		createdIn.Store(int64(time.Since(t0)))
	}()
	err := poll(ctx, o.phaseTimeout, func() (bool, error) {
		if e := createErr.Load(); e != nil {
			return false, fmt.Errorf("creating the policies: %w", *e)
		}
		if r.ready == 0 {
			ready, err := countPolicies(ctx, s.watch, isReady)
			if err != nil {
				return false, err
			}
			if ready == r.policies {
				r.ready = time.Since(t0)
			}
		}
		if r.cached == 0 {
			st, err := s.base.stats()
			if err != nil {
				return false, err
			}
			if st.Policies == int64(r.policies) {
				r.cached = time.Since(t0)
			}
		}
		return r.ready > 0 && r.cached > 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for every policy to be Ready: %w", err)
	}
	r.created = time.Duration(createdIn.Load())
	progress("all Ready after %v (baseline cached them all after %v)", r.ready.Round(time.Millisecond), r.cached.Round(time.Millisecond))
	return nil
}

// podChurn is (c): pods as the webhook admits them (with the sidecar),
// selected by every policy of the first churnNS namespaces, then their
// deletion. In rounds of one pod per namespace, the next round once the
// status counts the last: each pod event is then reconciled on its own,
// as in a rollout, rather than a namespace's pods arriving in one burst
// that a single reconcile absorbs.
func (s *sizeRun) podChurn(ctx context.Context) error {
	o, r := s.o, s.r
	progress("pod churn: %d rounds of %d pods, then of their deletion", o.churnPods, r.churnNS)
	counted := func(want int) func() (bool, error) {
		return func() (bool, error) {
			done, err := countPolicies(ctx, s.watch, func(p *v1alpha1.RateLimitPolicy) bool {
				return p.Namespace < namespace(r.churnNS) && p.Status.MatchedPods == int32(want) && p.Status.EnforcedPods == int32(want)
			})
			if err != nil {
				return false, err
			}
			st, err := s.base.stats()
			if err != nil {
				return false, err
			}
			return done == r.churnNS*o.perNamespace && st.Pods == int64(want*r.churnNS), nil
		}
	}
	round := func(pod int, deleting bool) (time.Duration, error) {
		t := time.Now()
		want := pod + 1
		if deleting {
			want = o.churnPods - pod - 1
		}
		err := parallel(ctx, o.clients, r.churnNS, func(ctx context.Context, i int) error {
			p, err := churnPod(namespace(i), fmt.Sprintf("web-%d", pod))
			if err != nil {
				return err
			}
			if deleting {
				return retry(ctx, func() error { return client.IgnoreNotFound(s.k.Delete(ctx, p)) })
			}
			return create(ctx, s.k, p)
		})
		if err == nil {
			err = poll(ctx, o.phaseTimeout, counted(want))
		}
		if err != nil {
			return 0, fmt.Errorf("pod churn, pod %d (deleting: %t): %w", pod, deleting, err)
		}
		return time.Since(t), nil
	}
	for _, deleting := range []bool{false, true} {
		for pod := range o.churnPods {
			d, err := round(pod, deleting)
			if err != nil {
				return err
			}
			if deleting {
				r.churnDown += d
			} else {
				r.churnUp += d
			}
		}
	}
	return nil
}

// policyChurn adds a policy to each of the first changeNS namespaces,
// waits until it is Ready and the namespace's ConfigMap changed, then deletes
// it and waits until the ConfigMap is back to its revision from before: what
// one policy change costs in a namespace that has policies already. (A
// policy's own status.revision does not move for its neighbours, so the
// ConfigMap's revision is what says the namespace took the change in.)
func (s *sizeRun) policyChurn(ctx context.Context) error {
	o, n := s.o, s.r.changeNS
	progress("adding, then deleting, one policy in each of %d namespaces", n)
	const extra = "extra"
	configRevisions := func() (map[string]string, error) {
		var list corev1.ConfigMapList
		if err := s.watch.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		m := map[string]string{}
		for _, cm := range list.Items {
			if cm.Name == sidecarconfig.ConfigMapName && cm.Namespace < namespace(n) {
				m[cm.Namespace] = cm.Annotations[v1alpha1.RevisionAnnotation]
			}
		}
		return m, nil
	}
	before, err := configRevisions()
	if err != nil {
		return err
	}
	// settled: each of the n namespaces has want policies, all Ready, and
	// its ConfigMap's revision satisfies done.
	settled := func(want int, done func(ns, revision string) bool) func() (bool, error) {
		return func() (bool, error) {
			var list v1alpha1.RateLimitPolicyList
			if err := s.watch.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
				return false, err
			}
			count := map[string]int{}
			for i := range list.Items {
				p := &list.Items[i]
				if p.Namespace >= namespace(n) {
					continue
				}
				if !isReady(p) {
					return false, nil
				}
				count[p.Namespace]++
			}
			revs, err := configRevisions()
			if err != nil {
				return false, err
			}
			for i := range n {
				ns := namespace(i)
				if count[ns] != want || !done(ns, revs[ns]) {
					return false, nil
				}
			}
			return true, nil
		}
	}

	err = parallel(ctx, o.clients, n, func(ctx context.Context, i int) error {
		return create(ctx, s.k, policy(namespace(i), extra, o.perNamespace))
	})
	if err == nil {
		err = poll(ctx, o.phaseTimeout, settled(o.perNamespace+1, func(ns, rev string) bool { return rev != before[ns] }))
	}
	if err != nil {
		return fmt.Errorf("adding a policy: %w", err)
	}
	err = parallel(ctx, o.clients, n, func(ctx context.Context, i int) error {
		p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace(i), Name: extra}}
		return retry(ctx, func() error { return client.IgnoreNotFound(s.k.Delete(ctx, p)) })
	})
	if err == nil {
		err = poll(ctx, o.phaseTimeout, settled(o.perNamespace, func(ns, rev string) bool { return rev == before[ns] }))
	}
	if err != nil {
		return fmt.Errorf("deleting the added policy: %w", err)
	}
	return nil
}

func namespace(i int) string { return fmt.Sprintf("bench-%05d", i) }

// policy is the i-th policy of a namespace: all of them select the same
// workload (app=web), each on its own path.
func policy(ns, name string, i int) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: &v1alpha1.LabelSelector{MatchLabels: map[string]v1alpha1.LabelValue{"app": "web"}},
			Window:         "1m",
			Limit:          100,
			Key:            v1alpha1.ClientKey{Source: v1alpha1.KeySourceHeader, Name: "X-User-ID"},
			Match:          &v1alpha1.RequestMatch{PathPrefixes: []v1alpha1.PathPrefix{v1alpha1.PathPrefix(fmt.Sprintf("/api/v%d/", i))}},
		},
	}
}

// churnPod is a pod of the selected workload as the injection webhook
// admits it: inject.Inject adds the sidecar and its status annotation, which
// the controller counts as enforcing.
func churnPod(ns, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
	err := inject.Inject(pod, inject.Options{Redis: redisconn.Config{Mode: redisconn.Standalone, Addrs: []string{"redis.slidegate-system:6379"}}})
	return pod, err
}

func isReady(p *v1alpha1.RateLimitPolicy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, string(v1alpha1.ConditionReady))
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.Generation && p.Status.ObservedGeneration == p.Generation
}

// countPolicies counts the cached policies for which pred holds.
func countPolicies(ctx context.Context, c client.Reader, pred func(*v1alpha1.RateLimitPolicy) bool) (int, error) {
	var list v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	n := 0
	for i := range list.Items {
		if pred(&list.Items[i]) {
			n++
		}
	}
	return n, nil
}

// countEvents counts the Events in the cluster (every one is the
// controller's: nothing else here emits any), a page at a time.
func countEvents(ctx context.Context, k client.Client) (int, error) {
	n := 0
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(eventsv1.SchemeGroupVersion.WithKind("EventList"))
	for {
		if err := k.List(ctx, list, client.Limit(5000), client.Continue(list.Continue)); err != nil {
			return 0, fmt.Errorf("counting events: %w", err)
		}
		n += len(list.Items)
		if list.Continue == "" {
			return n, nil
		}
	}
}

// poll calls done every 200 ms until it reports true or fails, or timeout.
func poll(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not done after %v", timeout)
		case <-tick.C:
		}
	}
}

// parallel calls fn for 0..n-1 from workers goroutines; the first error
// stops it.
func parallel(ctx context.Context, workers, n int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// create creates obj, retrying what an overloaded API server answers; an
// object that a timed-out attempt did create counts as created.
func create(ctx context.Context, k client.Client, obj client.Object) error {
	attempt := 0
	return retry(ctx, func() error {
		attempt++
		err := k.Create(ctx, obj)
		if attempt > 1 && apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// retry calls fn again, up to five times, while it fails the way an
// overloaded API server fails.
func retry(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || attempt == 5 || !overloaded(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}

func overloaded(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsInternalError(err)
}

// managerProc is a manager process: this program with -role.
type managerProc struct {
	role string
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func startManager(dir, role, kubeconfig string, events bool) (*managerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, role+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-role", role, "-credentials", credentials.String(), "-events="+strconv.FormatBool(events))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "POD_NAMESPACE="+credentials.Namespace)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &managerProc{role: role, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		if url, found := strings.CutPrefix(l, "stats "); ok && found {
			p.url = url
			return p, nil
		}
	case <-time.After(2 * time.Minute):
	}
	p.stop()
	return nil, fmt.Errorf("the %s manager did not start; see %s", role, logFile.Name())
}

func (p *managerProc) stats() (stats, error) {
	var s stats
	resp, err := http.Get(p.url)
	if err != nil {
		return s, fmt.Errorf("reading the %s manager's stats: %w", p.role, err)
	}
	defer func() { _ = resp.Body.Close() }()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitQuiet returns once the manager has made no write and no reconcile
// for the quiet period, with nothing queued or running.
func (p *managerProc) waitQuiet(ctx context.Context, quiet, timeout time.Duration) error {
	last, since := -1.0, time.Now()
	err := poll(ctx, timeout, func() (bool, error) {
		s, err := p.stats()
		if err != nil {
			return false, err
		}
		if activity := float64(s.totalWrites()) + s.Reconciles; activity != last {
			last, since = activity, time.Now()
			return false, nil
		}
		return s.QueueDepth == 0 && s.Active == 0 && time.Since(since) >= quiet, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the %s manager to be quiet: %w", p.role, err)
	}
	return nil
}

func (p *managerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// loadAvg is the machine's 1-minute load average (Linux), to tell a quiet
// run from one that shared the cores with other work.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	return strings.Fields(string(b))[0]
}
