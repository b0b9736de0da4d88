// Package version is slidegate's release version, for every binary: their
// --version flags, the build-info metrics, the sidecar injection annotation
// and the default image tags. Releases set it at build time:
//
//	go build -ldflags "-X github.com/slidegate/slidegate/internal/version.Version=v0.2.0"
//
// (the Makefile, the Dockerfile and hack/node-images.sh pass the VERSION
// file's). It imports nothing of the project, so every binary, the kubectl
// plugin included, can report it at no cost.
package version

import (
	"runtime/debug"
	"sync"
)

// Version is the release, set with -ldflags -X; empty in a plain go build.
var Version string

var get = sync.OnceValue(func() string {
	if Version != "" {
		return Version
	}
	rev, dirty := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	switch {
	case rev == "":
		return "devel"
	case dirty:
		return "devel-" + rev[:min(12, len(rev))] + "-dirty"
	}
	return "devel-" + rev[:min(12, len(rev))]
})

// Get is the release this binary was built as, or for a build without one
// "devel-<commit>" (Go's VCS stamp), or "devel".
func Get() string { return get() }
