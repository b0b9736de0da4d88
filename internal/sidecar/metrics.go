package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/slidegate/slidegate/internal/buildinfo"
	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/jwtverify"
)

type metrics struct {
	reg *prometheus.Registry

	// decisions are the series shared with the rate limit service.
	decisions      *enforce.Metrics
	jwtTokens      *prometheus.CounterVec
	responses      *prometheus.CounterVec
	upstreamErrors prometheus.Counter
	inflight       prometheus.Gauge
	costCharged    *prometheus.CounterVec

	reloads          *enforce.ReloadMetrics
	revision         *prometheus.GaugeVec
	lastReloadTime   prometheus.Gauge
	configLoaded     prometheus.Gauge
	policiesActive   prometheus.Gauge
	policiesInConfig prometheus.Gauge
}

// Response outcomes, the label of slidegate_sidecar_responses_total.
const (
	outcomeForwarded    = "forwarded"
	outcomeRejected     = "rejected"
	outcomeFailedClosed = "failed_closed"
	outcomeNoConfig     = "no_config"
	outcomeBadRequest   = "bad_request"
)

func newMetrics(fallbackActive func() float64, policyReplicas func(yield func(policy string, n int))) *metrics {
	const ns, sub = "slidegate", "sidecar"
	m := &metrics{reg: prometheus.NewRegistry()}
	m.decisions = enforce.NewMetrics(sub, "requests")
	m.jwtTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "jwt_tokens_total",
		Help: "Bearer tokens checked by the policies that verify them (key.jwt), by policy and result: verified, or why not (malformed, algorithm, unknown_key, signature, expired, not_yet_valid, issuer, audience); an unverified token's request follows the policy's onMissing. unknown_key during a key rotation means tokens signed by a key the sidecar has not got yet.",
	}, []string{"policy", "result"})
	m.responses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "responses_total",
		Help: "Requests by outcome: forwarded to the application, rejected (429), failed_closed (503) or no_config (503 before any config loaded).",
	}, []string{"outcome"})
	m.upstreamErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "upstream_errors_total",
		Help: "Forwarded requests that failed to reach the application or lost it mid-response (502 when nothing was sent yet).",
	})
	m.costCharged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "cost_charged_total",
		Help: "Cost (e.g. tokens) charged after responses by the policies with a response cost (spec.cost.response), by policy and where the response reported it: header, trailer, body, or default (it reported none: the policy's default was charged).",
	}, []string{"policy", "source"})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "inflight_requests",
		Help: "Requests being handled, upgraded connections included.",
	})
	fallback := enforce.NewFallbackGauge(sub, "reject", fallbackActive)
	m.newConfigMetrics(ns, sub)
	replicas := replicasCollector{
		desc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "policy_replicas"),
			"Sidecars that enforce the policy, as last counted through Redis (else --fallback-replicas): while Redis is away a fail-open policy admits ceil(limit / this) here.",
			[]string{"policy"}, nil),
		each: policyReplicas,
	}
	m.reg.MustRegister(m.decisions.Collectors()...)
	m.reg.MustRegister(m.reloads.Collectors()...)
	m.reg.MustRegister(
		m.jwtTokens, m.responses,
		m.upstreamErrors, m.inflight, m.costCharged, fallback, replicas, m.revision,
		m.lastReloadTime, m.configLoaded, m.policiesActive, m.policiesInConfig,
		buildinfo.Collector("sidecar"),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// newConfigMetrics makes the metrics of the config in force: its
// reloads, revision and policies.
func (m *metrics) newConfigMetrics(ns, sub string) {
	m.reloads = enforce.NewReloadMetrics(sub, "config or labels file", "sidecar")
	m.revision = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "config_revision_info",
		Help: "1 for the revision (digest of the config and labels files) in force.",
	}, []string{"revision"})
	m.lastReloadTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "config_last_reload_success_timestamp_seconds",
		Help: "Time of the last successful config load.",
	})
	m.configLoaded = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "config_loaded",
		Help: "1 once a config has been loaded.",
	})
	m.policiesActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "policies_active",
		Help: "Policies of the config whose selector matches this pod.",
	})
	m.policiesInConfig = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "policies_in_config",
		Help: "Policies in the namespace's config.",
	})
}

// TokenVerified is the result label of a token that verified.
const TokenVerified = "verified"

// tokenResult is the result label of a verification's failure.
func tokenResult(f jwtverify.Failure) string {
	if f == "" {
		return TokenVerified
	}
	return string(f)
}

// replicasCollector reports slidegate_sidecar_policy_replicas at scrape
// time from the counts the sidecar keeps, so a policy that goes leaves no
// series behind.
type replicasCollector struct {
	desc *prometheus.Desc
	each func(yield func(policy string, n int))
}

func (c replicasCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c replicasCollector) Collect(ch chan<- prometheus.Metric) {
	c.each(func(policy string, n int) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), policy)
	})
}
