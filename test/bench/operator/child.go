package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/controllers"
	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/manager"
	"github.com/slidegate/slidegate/internal/redisidentity"
)

// The two manager processes the bench measures. Each is this program run
// again with -role, so that its RSS and CPU are its own, not the load
// generator's.
const (
	roleController = "controller"
	roleBaseline   = "baseline"
)

// stats is what a manager process reports on its stats endpoint.
type stats struct {
	// CPUSeconds is user + system time of the process (getrusage).
	CPUSeconds float64 `json:"cpuSeconds"`
	// PeakRSS and RSS are VmHWM and VmRSS of /proc/self/status, in bytes.
	PeakRSS int64 `json:"peakRSS"`
	RSS     int64 `json:"rss"`
	// LiveHeap is the Go heap that the last GC found live, in bytes: what
	// the process holds, without the garbage that RSS also counts.
	LiveHeap int64 `json:"liveHeap"`
	// Writes counts the API writes attempted through the manager's client,
	// by "Kind verb" ("ConfigMap apply", "RateLimitPolicy status patch");
	// Failed counts those that failed, by "Kind verb reason".
	Writes map[string]int64 `json:"writes"`
	Failed map[string]int64 `json:"failed"`
	// MetricWrites is the controller's slidegate_controller_writes_total,
	// by "resource operation": the successful writes, to check Writes.
	MetricWrites map[string]float64 `json:"metricWrites"`
	// Reconciles, ReconcileSeconds (their time, added up), QueueDepth,
	// Active and Workers (MaxConcurrentReconciles) are controller-runtime's
	// metrics of the manager's one controller.
	Reconciles       float64 `json:"reconciles"`
	ReconcileSeconds float64 `json:"reconcileSeconds"`
	QueueDepth       float64 `json:"queueDepth"`
	Active           float64 `json:"active"`
	Workers          float64 `json:"workers"`
	// Policies and Pods are the objects in the baseline's cache, counted
	// by informer handlers (baseline only).
	Policies int64 `json:"policies"`
	Pods     int64 `json:"pods"`
}

func (s *stats) totalWrites() int64 {
	var n int64
	for _, v := range s.Writes {
		n += v
	}
	return n
}

// runManager is the body of a manager process: the real controller, set up
// as cmd/manager sets it up, or the baseline. It prints "stats <url>" on
// stdout once its caches have synced, then serves its stats there until it
// is signalled.
func runManager(role, credentials string, events bool) error {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zap.Options{})))
	ns, name, ok := strings.Cut(credentials, "/")
	if !ok {
		return fmt.Errorf("-credentials %q: want namespace/name", credentials)
	}
	creds := types.NamespacedName{Namespace: ns, Name: name}

	writes := &countingClient{writes: map[string]int64{}, failed: map[string]int64{}}
	// As cmd/manager: the kubeconfig from $KUBECONFIG, client-side rate
	// limiting off (controller-runtime's default, QPS -1), the controller's
	// cache options; no metrics server or probes, and no webhook (no pod
	// here is admitted through it).
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		NewClient: func(cfg *rest.Config, opts client.Options) (client.Client, error) {
			c, err := client.New(cfg, opts)
			writes.Client = c
			return writes, err
		},
	})
	if err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	var b *baseline
	switch role {
	case roleController:
		r := &controllers.RateLimitPolicyReconciler{
			Client:     mgr.GetClient(),
			Recorder:   mgr.GetEventRecorder("slidegate-controller"),
			Identities: &redisidentity.Identities{Mode: redisidentity.Shared, SharedSecret: creds},
		}
		if !events {
			r.Recorder = nil
		}
		// No install key (namespace ""): the Secrets mirror the
		// credentials alone, as the baseline's do.
		if err := manager.PolicyDependencies(ctx, mgr, r, "", jwksfetch.Options{}); err != nil {
			return err
		}
		if err := r.SetupWithManager(ctx, mgr); err != nil {
			return err
		}
	case roleBaseline:
		if b, err = setupBaseline(ctx, mgr, creds); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown -role %q", role)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s := collect(writes)
		if b != nil {
			s.Policies, s.Pods = b.policies.Load(), b.pods.Load()
		}
		_ = json.NewEncoder(w).Encode(s)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	started := make(chan error, 1)
	go func() { started <- mgr.Start(ctx) }()
	if err := waitSynced(ctx, mgr, role); err != nil {
		return err
	}
	fmt.Printf("stats http://%s\n", ln.Addr())
	if err := <-started; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// waitSynced returns once the informers the controller starts with have
// synced. The real controller's Namespace informer starts at its first
// reconcile (a cached Get), as in production; the baseline starts it
// upfront.
func waitSynced(ctx context.Context, mgr ctrl.Manager, role string) error {
	objs := []client.Object{&v1alpha1.RateLimitPolicy{}, &corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Service{}, &corev1.Pod{}}
	if role == roleBaseline {
		objs = append(objs, &corev1.Namespace{})
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, o := range objs {
		// Blocks until this informer has synced.
		if _, err := mgr.GetCache().GetInformer(ctx, o); err != nil {
			return fmt.Errorf("waiting for the %T informer: %w", o, err)
		}
	}
	return nil
}

// baseline is "a controller that only caches the same objects": the
// manager's cache options, the informers and the field index that
// controllers.SetupWithManager sets up (policies, the sidecar ConfigMaps
// and mirrored Secrets, Services, trimmed Pods, Namespaces, and the cache of
// the one credentials Secret), and a controller over them whose reconciler
// does nothing. Keep it in line with controllers/setup.go.
type baseline struct {
	policies, pods atomic.Int64
}

func setupBaseline(ctx context.Context, mgr ctrl.Manager, creds types.NamespacedName) (*baseline, error) {
	b := &baseline{}
	// The same index name, on an equally cheap function: what it costs is
	// the index itself, kept per object in the informer.
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.RateLimitPolicy{}, "spec.targetSelector.requiredLabelKeys", func(o client.Object) []string {
		p := o.(*v1alpha1.RateLimitPolicy)
		key := "*"
		if p.Spec.TargetSelector == nil {
			return nil
		}
		for k := range p.Spec.TargetSelector.MatchLabels {
			if key == "*" || k < key {
				key = k
			}
		}
		return []string{key}
	}); err != nil {
		return nil, err
	}
	credsCache, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Namespaces: map[string]cache.Config{creds.Namespace: {
				FieldSelector: fields.OneTermEqualSelector("metadata.name", creds.Name),
			}}},
		},
	})
	if err != nil {
		return nil, err
	}
	if _, err := credsCache.GetInformer(ctx, &corev1.Secret{}); err != nil {
		return nil, err
	}
	if err := mgr.Add(managerCache{credsCache}); err != nil {
		return nil, err
	}
	for obj, n := range map[client.Object]*atomic.Int64{&v1alpha1.RateLimitPolicy{}: &b.policies, &corev1.Pod{}: &b.pods} {
		inf, err := mgr.GetCache().GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { n.Add(1) },
			DeleteFunc: func(any) { n.Add(-1) },
		}); err != nil {
			return nil, err
		}
	}
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.Namespace{}, cache.BlockUntilSynced(false)); err != nil {
		return nil, err
	}
	byNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	return b, ctrl.NewControllerManagedBy(mgr).
		Named("baseline").
		Watches(&v1alpha1.RateLimitPolicy{}, byNamespace).
		Watches(&corev1.ConfigMap{}, byNamespace).
		Watches(&corev1.Secret{}, byNamespace).
		Watches(&corev1.Service{}, byNamespace).
		Watches(&corev1.Pod{}, byNamespace).
		WatchesRawSource(source.Kind[client.Object](credsCache, &corev1.Secret{}, byNamespace)).
		Complete(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, nil
		}))
}

// managerCache makes the manager start and wait for a cache of its own
// with its caches (as controllers/setup.go does for the credentials).
type managerCache struct{ cache.Cache }

func (c managerCache) GetCache() cache.Cache { return c.Cache }

// collect reads the process's usage and the counters.
func collect(c *countingClient) stats {
	s := stats{MetricWrites: map[string]float64{}}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	s.PeakRSS, s.RSS = procStatus("VmHWM:"), procStatus("VmRSS:")
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	if live[0].Value.Kind() == metrics.KindUint64 {
		s.LiveHeap = int64(live[0].Value.Uint64())
	}
	s.Writes, s.Failed = c.counts()
	families, _ := ctrlmetrics.Registry.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			lbl := map[string]string{}
			for _, l := range m.GetLabel() {
				lbl[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "slidegate_controller_writes_total":
				s.MetricWrites[lbl["resource"]+" "+lbl["operation"]] += m.GetCounter().GetValue()
			case "controller_runtime_reconcile_total":
				s.Reconciles += m.GetCounter().GetValue()
			case "controller_runtime_reconcile_time_seconds":
				s.ReconcileSeconds += m.GetHistogram().GetSampleSum()
			case "workqueue_depth":
				s.QueueDepth += m.GetGauge().GetValue()
			case "controller_runtime_active_workers":
				s.Active += m.GetGauge().GetValue()
			case "controller_runtime_max_concurrent_reconciles":
				s.Workers += m.GetGauge().GetValue()
			}
		}
	}
	return s
}

// procStatus reads a size field ("VmHWM:") of /proc/self/status, in bytes.
func procStatus(field string) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// countingClient counts the writes attempted through it by kind and verb,
// and the failed ones by reason (after controllers/suite_test.go).
type countingClient struct {
	client.Client
	mu             sync.Mutex
	writes, failed map[string]int64
}

func (c *countingClient) counts() (writes, failed map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	writes, failed = map[string]int64{}, map[string]int64{}
	for k, v := range c.writes {
		writes[k] = v
	}
	for k, v := range c.failed {
		failed[k] = v
	}
	return writes, failed
}

func (c *countingClient) record(verb string, obj any, err error) error {
	kind := fmt.Sprintf("%T", obj)
	switch o := obj.(type) {
	case runtime.Object:
		if gvk, gerr := apiutil.GVKForObject(o, scheme); gerr == nil {
			kind = gvk.Kind
		}
	case interface{ GetKind() *string }:
		if k := o.GetKind(); k != nil {
			kind = *k
		}
	}
	key := kind + " " + verb
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes[key]++
	if err != nil {
		reason := string(apierrors.ReasonForError(err))
		if reason == "" {
			reason = "error"
		}
		c.failed[key+" "+reason]++
	}
	return err
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.record("create", obj, c.Client.Create(ctx, obj, opts...))
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.record("update", obj, c.Client.Update(ctx, obj, opts...))
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.record("patch", obj, c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return c.record("apply", obj, c.Client.Apply(ctx, obj, opts...))
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.record("delete", obj, c.Client.Delete(ctx, obj, opts...))
}

func (c *countingClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	return c.record("deleteallof", obj, c.Client.DeleteAllOf(ctx, obj, opts...))
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

func (c *countingClient) SubResource(name string) client.SubResourceClient {
	panic("the controller uses no subresource client but status: count " + name + " writes before using it")
}

type countingStatus struct {
	client.SubResourceWriter
	c *countingClient
}

func (s *countingStatus) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return s.c.record("status create", obj, s.SubResourceWriter.Create(ctx, obj, sub, opts...))
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return s.c.record("status update", obj, s.SubResourceWriter.Update(ctx, obj, opts...))
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return s.c.record("status patch", obj, s.SubResourceWriter.Patch(ctx, obj, patch, opts...))
}

func (s *countingStatus) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return s.c.record("status apply", obj, s.SubResourceWriter.Apply(ctx, obj, opts...))
}
