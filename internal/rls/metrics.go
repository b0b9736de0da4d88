package rls

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/slidegate/slidegate/internal/buildinfo"
	"github.com/slidegate/slidegate/internal/enforce"
)

// Values of the code label of slidegate_rls_responses_total.
const (
	responseOK        = "ok"
	responseOverLimit = "over_limit"
	responseInvalid   = "invalid_argument"
	responseNoConfig  = "no_config"
	// responseCallTooLarge: the call's hits added up to more than
	// MaxCallHits; answered OVER_LIMIT where an enforced policy matched.
	responseCallTooLarge = "call_too_large"
)

type metrics struct {
	reg *prometheus.Registry

	// decisions are the series shared with the sidecar.
	decisions *enforce.Metrics
	responses *prometheus.CounterVec
	// answered are responses' counters, one per code, bound once: a label
	// lookup per call hashes the code and takes the vector's lock.
	answered struct{ ok, overLimit, invalid, noConfig, tooLarge prometheus.Counter }
	reloads  *enforce.ReloadMetrics
	policies prometheus.Gauge
	peers    prometheus.Gauge
	// handshakeFailures counts refused TLS handshakes (TLSCreds).
	handshakeFailures prometheus.Counter
}

// newMetrics registers the RLS server's metrics: the sidecar's names under
// the subsystem "rls" where they mean the same.
func newMetrics(fallbackActive func() float64) *metrics {
	const ns, sub = "slidegate", "rls"
	m := &metrics{reg: prometheus.NewRegistry()}
	m.decisions = enforce.NewMetrics(sub, "RLS requests")
	m.responses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "responses_total",
		Help: "RLS answers by code: ok, over_limit, invalid_argument, no_config (UNAVAILABLE before any config loaded), call_too_large (hits over the bound of one call: OVER_LIMIT, nothing counted).",
	}, []string{"code"})
	fallback := enforce.NewFallbackGauge(sub, "answer OVER_LIMIT", fallbackActive)
	m.reloads = enforce.NewReloadMetrics(sub, "config file", "server")
	m.policies = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "policies_active",
		Help: "Policies of the config in force.",
	})
	m.peers = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "peers",
		Help: "RLS replicas counted through Redis (the fail-open share's divisor).",
	})
	m.handshakeFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "tls_handshake_failures_total",
		Help: "Connections to the TLS gRPC listener whose handshake failed: no client certificate, one the client CA did not sign or whose name is not allowed, plaintext, or a dropped connection.",
	})
	m.reg.MustRegister(m.decisions.Collectors()...)
	m.reg.MustRegister(m.reloads.Collectors()...)
	a := &m.answered
	a.ok, a.overLimit = m.responses.WithLabelValues(responseOK), m.responses.WithLabelValues(responseOverLimit)
	a.invalid, a.noConfig = m.responses.WithLabelValues(responseInvalid), m.responses.WithLabelValues(responseNoConfig)
	a.tooLarge = m.responses.WithLabelValues(responseCallTooLarge)
	m.reg.MustRegister(m.responses,
		fallback, m.policies, m.peers, m.handshakeFailures, buildinfo.Collector("rls"),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the server's Prometheus registry, for the metrics endpoint.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }
