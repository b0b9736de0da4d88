/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// beforeKubeFree is the last commit whose sidecar linked the Kubernetes API
// types and apimachinery (for one Secret's name in a log line); the next
// one, c1b2b60, dropped them (issue 38).
const beforeKubeFree = "a0fdab210998e843e6caac4fd1123177d8de5b9e"

// idleSection measures the resident memory of an idle sidecar process:
// this checkout's cmd/sidecar and that of beforeKubeFree, built alike
// (-ldflags="-s -w", as make image builds it), each started idleRounds
// times in turn on the bench's config file and redis-server and read once
// it is ready and has idled a second. Without the repository's history
// (a shallow clone) only this checkout's is measured.
func idleSection(ctx context.Context, tmp, cfgFile, redisAddr string) (string, error) {
	const idleRounds = 3
	type build struct {
		name, bin string
		rss       []int64
		size      int64
	}
	builds := []*build{{name: "this checkout", bin: filepath.Join(tmp, "sidecar-now")}}
	if err := goBuild(ctx, ".", builds[0].bin); err != nil {
		return "", err
	}
	wt := filepath.Join(tmp, "before")
	if err := exec.CommandContext(ctx, "git", "worktree", "add", "--detach", wt, beforeKubeFree).Run(); err == nil { //nolint:gosec // the bench's own arguments
		defer func() { _ = exec.Command("git", "worktree", "remove", "--force", wt).Run() }() //nolint:gosec // the bench's own arguments
		b := &build{name: "before (" + beforeKubeFree[:7] + ", with the API types)", bin: filepath.Join(tmp, "sidecar-before")}
		if err := goBuild(ctx, wt, b.bin); err != nil {
			return "", err
		}
		builds = append(builds, b)
	}
	for _, b := range builds {
		st, err := os.Stat(b.bin)
		if err != nil {
			return "", err
		}
		b.size = st.Size()
	}
	for range idleRounds {
		for _, b := range builds {
			rss, err := idleRSS(ctx, b.bin, cfgFile, redisAddr)
			if err != nil {
				return "", fmt.Errorf("%s: %w", b.name, err)
			}
			b.rss = append(b.rss, rss)
		}
	}
	var s strings.Builder
	s.WriteString("\n### An idle sidecar's memory\n\n")
	fmt.Fprintf(&s, "VmRSS of a sidecar process started on the config above and this redis-server, ready and idle for a second; median of %d starts, the builds in turn.\n\n", idleRounds)
	s.WriteString("| sidecar | stripped binary | idle RSS | ÷ this checkout |\n|---|---:|---:|---:|\n")
	now := median64(builds[0].rss)
	for _, b := range builds {
		fmt.Fprintf(&s, "| %s | %.1f MB | %.1f MiB | %.2f |\n", b.name, float64(b.size)/1e6, float64(median64(b.rss))/(1<<20), float64(median64(b.rss))/float64(now))
	}
	if len(builds) == 1 {
		s.WriteString("\nNo history to build " + beforeKubeFree[:7] + " from (a shallow clone): this checkout's only.\n")
	}
	return s.String(), nil
}

// goBuild builds the sidecar of the module in dir.
func goBuild(ctx context.Context, dir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags=-s -w", "-o", out, "./cmd/sidecar") //nolint:gosec // the bench's own arguments
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/sidecar in %s: %w: %s", dir, err, b)
	}
	return nil
}

// idleRSS starts bin, waits until its /readyz answers 200 and a second
// more, and returns its VmRSS in bytes.
func idleRSS(ctx context.Context, bin, cfgFile, redisAddr string) (int64, error) {
	ports := make([]string, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		ports[i] = l.Addr().String()
		_ = l.Close()
	}
	cmd := exec.CommandContext(ctx, bin, "--config-file", cfgFile, "--redis-addrs", redisAddr, "--upstream", "http://127.0.0.1:1", //nolint:gosec // the bench's own binaries
		"--listen-address", ports[0], "--admin-address", ports[1], "--debug-address", ports[2], "--pod-labels-file", "", "--log-level", "error")
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for ; ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + ports[1] + "/readyz") //nolint:noctx // a loopback probe
		if err != nil {
			last = err.Error()
		} else {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			last = resp.Status
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not ready after 20s (last: %s)", last)
		}
	}
	time.Sleep(time.Second)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", cmd.Process.Pid)
}

func median64(xs []int64) int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
