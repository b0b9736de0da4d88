package enforce

import "github.com/prometheus/client_golang/prometheus"

// ReloadMetrics are the series in which both front ends report the loads
// of their rendered document (the sidecar's config, the rate limit
// service's): a failed load keeps the last good document, so these are how
// anyone learns of one.
type ReloadMetrics struct {
	// Reloads counts the loads of a changed document by result (success,
	// failure).
	Reloads *prometheus.CounterVec
	// LastOK is 0 while the last load failed.
	LastOK prometheus.Gauge
	// Skipped is the policies of the document in force that need a newer
	// front end.
	Skipped prometheus.Gauge

	success, failure prometheus.Counter
}

// NewReloadMetrics returns the reload metrics of subsystem sub, whose
// document comes from files (the help texts' noun: "config file") and is
// read by who ("sidecar", "server").
func NewReloadMetrics(sub, files, who string) *ReloadMetrics {
	const ns = "slidegate"
	m := &ReloadMetrics{}
	m.Reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "config_reloads_total",
		Help: "Loads of a changed " + files + ", by result (success, failure); a failure keeps the last good config.",
	}, []string{"result"})
	m.success, m.failure = m.Reloads.WithLabelValues("success"), m.Reloads.WithLabelValues("failure")
	m.LastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "config_last_reload_successful",
		Help: "1 if the last attempt to load a changed config succeeded, 0 if it failed (the last good config stays in force).",
	})
	m.Skipped = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "config_policies_skipped",
		Help: "Policies of the config that this " + who + " does not enforce because they need a newer " + who + " (fields it does not know); the log names them.",
	})
	// Nothing has failed yet.
	m.LastOK.Set(1)
	return m
}

// Collectors are the metrics, to register.
func (m *ReloadMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Reloads, m.LastOK, m.Skipped}
}

// Loaded counts a document put in force, of which skipped policies are not
// enforced.
func (m *ReloadMetrics) Loaded(skipped int) {
	m.success.Inc()
	m.LastOK.Set(1)
	m.Skipped.Set(float64(skipped))
}

// Failed counts a document that could not be loaded.
func (m *ReloadMetrics) Failed() {
	m.failure.Inc()
	m.LastOK.Set(0)
}

// Recovered says that the files are the document in force again, after a
// failure.
func (m *ReloadMetrics) Recovered() { m.LastOK.Set(1) }

// NewFallbackGauge is slidegate_<sub>_fallback_active: active reports
// whether the limiter's circuit to Redis is open; failClosed is what a
// fail-closed policy answers meanwhile.
func NewFallbackGauge(sub, failClosed string, active func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "slidegate", Subsystem: sub, Name: "fallback_active",
		Help: "1 while the limiter's circuit to Redis is open: fail-open policies decide locally, fail-closed ones " + failClosed + ".",
	}, active)
}
