// Package buildinfo is the build-info metric of every slidegate binary that
// serves metrics, apart from package version so that the kubectl plugin
// reports its version without linking Prometheus.
package buildinfo

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/version"
)

// Collector is slidegate_build_info{component, version, config_minor}, always
// 1: the release a process runs and the newest sidecar config minor version
// it reads and writes, so that an upgrade's progress is a PromQL query
// (count by (version) (slidegate_build_info{component="sidecar"})).
func Collector(component string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "slidegate",
		Name:      "build_info",
		Help:      "Always 1: the slidegate release (version) this process runs, and the newest sidecar configuration minor version it reads and writes (config_minor).",
		ConstLabels: prometheus.Labels{
			"component":    component,
			"version":      version.Get(),
			"config_minor": strconv.Itoa(sidecarconfig.Minor),
		},
	})
	g.Set(1)
	return g
}
