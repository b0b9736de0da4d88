package testsupport

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Sentinel is a redis-server in sentinel mode that monitors one master.
type Sentinel struct {
	Addr     string
	password string
}

// SentinelOptions shape a Sentinel.
type SentinelOptions struct {
	// Password, when set, is required from the sentinel's clients
	// (requirepass).
	Password string
	// DownAfter is down-after-milliseconds (default Redis's 30s): how long
	// the master may not answer before the sentinel fails it over.
	DownAfter time.Duration
	// Users are ACL rules of users, one "name rules..." each, written as
	// user directives of sentinel.conf.
	Users []string
}

// StartSentinel starts a sentinel on a free loopback port that monitors
// master as masterName and, when password is not empty, requires it from
// its clients (requirepass). It returns once the sentinel reports the
// master, and stops with the test.
func StartSentinel(tb testing.TB, master *Redis, masterName, password string) *Sentinel {
	tb.Helper()
	return StartSentinelWith(tb, master, masterName, SentinelOptions{Password: password})
}

// StartSentinelWith is StartSentinel with more options.
func StartSentinelWith(tb testing.TB, master *Redis, masterName string, o SentinelOptions) *Sentinel {
	tb.Helper()
	bin, err := RedisServerPath()
	if err != nil {
		Missing(tb, "redis-server", err)
	}
	var lastErr error
	// As for redis-server: another port when the probed one is taken.
	for range 3 {
		s, stop, err := startSentinel(tb, bin, master, masterName, o)
		if err == nil {
			tb.Cleanup(stop)
			return s
		}
		stop()
		lastErr = err
	}
	tb.Fatalf("starting a sentinel: %v", lastErr)
	return nil
}

func startSentinel(tb testing.TB, bin string, master *Redis, masterName string, o SentinelOptions) (*Sentinel, func(), error) {
	password := o.Password
	port, err := freePort()
	if err != nil {
		return nil, func() {}, err
	}
	dir := configDir(tb)
	logPath := filepath.Join(dir, "sentinel.log")
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s 127.0.0.1 %d 1\n", port, dir, logPath, masterName, master.Port)
	if password != "" {
		conf += "requirepass " + password + "\n"
	}
	for _, u := range o.Users {
		conf += "user " + u + "\n"
	}
	if o.DownAfter > 0 {
		conf += fmt.Sprintf("sentinel down-after-milliseconds %s %d\n", masterName, o.DownAfter.Milliseconds())
	}
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, func() {}, err
	}
	cmd := exec.Command(bin, path, "--sentinel")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, func() {}, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		// What the sentinel saw (+sdown, +failover-abort-no-good-slave, …)
		// is the only account of a failover that did not happen.
		if tb.Failed() {
			b, _ := os.ReadFile(logPath)
			tb.Logf("sentinel %d's log:\n%s", port, b)
		}
	}
	s := &Sentinel{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), password: password}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName)
		if err == nil && strings.HasSuffix(got, "\n"+strconv.Itoa(master.Port)) {
			return s, stop, nil
		}
		select {
		case <-exited:
			return nil, stop, fmt.Errorf("sentinel on port %d exited at start", port)
		default:
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("reply %q", got)
			}
			return nil, stop, fmt.Errorf("sentinel %s does not report master %s: %w", s.Addr, masterName, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Do sends one command to the sentinel (after AUTH when it has a password).
func (s *Sentinel) Do(args ...string) (string, error) {
	if s.password == "" {
		return do(s.Addr, args...)
	}
	return doAuth(s.Addr, s.password, args...)
}

// Master is the address the sentinel gives for masterName now.
func (s *Sentinel) Master(masterName string) (string, error) {
	got, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(got, "\n")
	if !ok {
		return "", fmt.Errorf("GET-MASTER-ADDR-BY-NAME %s: %q", masterName, got)
	}
	return net.JoinHostPort(host, port), nil
}

// configDir is where a sentinel keeps its config: on a tmpfs when the
// machine has one (stateDir). A sentinel rewrites and fsyncs its config
// when it votes and when it switches masters, from its event loop; on a
// busy disk that fsync can hold the loop past the 2 s that put the
// sentinel in TILT (see Await).
func configDir(tb testing.TB) string {
	dir, err := stateDir("slidegate-sentinel-")
	if err != nil {
		return tb.TempDir()
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Await polls cond every 50 ms until it holds or timeout has passed, and
// does not count the time the sentinel spends in TILT. A sentinel whose
// event loop did not run for 2 s (a starved process, a slow fsync) no
// longer trusts its clock and acts on nothing for 30 s, by design: a
// failover waits that long, and a test that gave it 30 s would fail on a
// busy machine for a reason that is not its subject. tilted is how long
// the sentinel was seen in TILT.
func (s *Sentinel) Await(timeout time.Duration, cond func() bool) (tilted time.Duration, ok bool) {
	const poll = 50 * time.Millisecond
	start := time.Now()
	last, inTilt := start, false
	for {
		if cond() {
			return tilted, true
		}
		now := time.Now()
		if inTilt {
			tilted += now.Sub(last)
		}
		last = now
		inTilt = s.inTilt()
		if now.Sub(start) > timeout+tilted {
			return tilted, false
		}
		time.Sleep(poll)
	}
}

// inTilt reports whether the sentinel says it is in TILT (INFO sentinel).
func (s *Sentinel) inTilt() bool {
	info, err := s.Do("INFO", "sentinel")
	return err == nil && strings.Contains(info, "sentinel_tilt:1")
}

// WaitReplicas waits until the sentinel knows n replicas of masterName that
// it does not consider down: a failover needs one.
func (s *Sentinel) WaitReplicas(masterName string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := s.Do("SENTINEL", "REPLICAS", masterName)
		if err == nil {
			up := 0
			for _, f := range strings.Split(got, "\n") {
				if strings.HasPrefix(f, "slave") && !strings.Contains(f, "down") && !strings.Contains(f, "disconnected") {
					up++
				}
			}
			if up >= n {
				return nil
			}
			err = fmt.Errorf("replicas: %q", got)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinel %s: %d replicas of %s not known after %v: %w", s.Addr, n, masterName, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
