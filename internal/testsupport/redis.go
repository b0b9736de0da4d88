package testsupport

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Redis is one redis-server process on a loopback port, without persistence.
// It can be killed, paused (SIGSTOP) and restarted on the same port, which is
// how the fault tests simulate a dead or hung Redis.
type Redis struct {
	Addr string
	Port int

	dir   string
	extra []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts a standalone redis-server for one test and stops it when
// the test ends.
func StartRedis(tb testing.TB, extraArgs ...string) *Redis {
	tb.Helper()
	if _, err := RedisServerPath(); err != nil {
		Missing(tb, "redis-server", err)
	}
	r, err := NewRedis(extraArgs...)
	if err != nil {
		tb.Fatalf("starting redis-server: %v", err)
	}
	tb.Cleanup(r.Close)
	return r
}

// NewRedis starts a standalone redis-server. The caller must Close it.
func NewRedis(extraArgs ...string) (*Redis, error) {
	return newRedis(freePort, extraArgs...)
}

func newRedis(freePort func() (int, error), extraArgs ...string) (*Redis, error) {
	var lastErr error
	// A free port can be taken by someone else between our probe and the
	// server's bind; a few tries make that race harmless.
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir, err := stateDir("slidegate-redis-")
		if err != nil {
			return nil, err
		}
		r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, dir: dir, extra: extraArgs}
		if lastErr = r.start(); lastErr == nil {
			return r, nil
		}
		r.Close()
	}
	return nil, lastErr
}

func (r *Redis) start(extraArgs ...string) error {
	bin, err := RedisServerPath()
	if err != nil {
		return err
	}
	args := []string{
		"--port", strconv.Itoa(r.Port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", r.dir,
		"--logfile", filepath.Join(r.dir, "redis.log"),
		"--protected-mode", "no",
		// DEBUG SLEEP makes the server slow, not down, for the fault tests.
		"--enable-debug-command", "local",
	}
	args = append(args, r.extra...)
	args = append(args, extraArgs...)
	cmd := exec.Command(bin, args...)
	// Die with the test binary even if it is killed, so no server outlives a run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start: %s", r.Port, r.logTail())
		default:
		}
		if reply, err := r.Do("PING"); err == nil && reply == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on port %d not ready after 10s: %s", r.Port, r.logTail())
}

func (r *Redis) logTail() string {
	lines := r.logLines()
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// logLines are the lines of the server's log so far.
func (r *Redis) logLines() []string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// CPUTime is the user and system CPU time the server has used, from
// /proc/<pid>/stat (fields utime and stime, in clock ticks of 1/100 s, the
// USER_HZ of every Linux architecture Go runs on): what the benchmarks
// divide by the decisions Redis made.
func (r *Redis) CPUTime() (time.Duration, error) {
	pid := r.Pid()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("redis-server CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count the fields after its closing one.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("redis-server CPU time: short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("redis-server CPU time: /proc/%d/stat fields %q %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// Pid is the process id of the running server (0 when it is not running).
func (r *Redis) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Redis) signal(sig syscall.Signal) error {
	pid := r.Pid()
	if pid == 0 {
		return errors.New("redis-server is not running")
	}
	return syscall.Kill(pid, sig)
}

// Kill sends SIGKILL and waits for the process to end: a crashed Redis.
func (r *Redis) Kill() error {
	if err := r.signal(syscall.SIGKILL); err != nil {
		return err
	}
	r.mu.Lock()
	done := r.done
	r.cmd = nil
	r.mu.Unlock()
	<-done
	return nil
}

// Pause sends SIGSTOP: the port still accepts connections but nothing
// answers, like a Redis stuck in a long command or a partitioned network.
func (r *Redis) Pause() error { return r.signal(syscall.SIGSTOP) }

// Resume sends SIGCONT after Pause.
func (r *Redis) Resume() error { return r.signal(syscall.SIGCONT) }

// Restart starts the server again on the same port after Kill. The data is
// gone, as are the cached scripts, like a real restart without persistence.
func (r *Redis) Restart() error { return r.RestartWith() }

// RestartWith is Restart with extraArgs added to this start only (e.g.
// --replicaof, for a former master that comes back as a replica).
func (r *Redis) RestartWith(extraArgs ...string) error {
	if r.Pid() != 0 {
		return errors.New("redis-server is still running")
	}
	return r.start(extraArgs...)
}

// Close stops the server and removes its directory.
func (r *Redis) Close() {
	if pid := r.Pid(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		r.mu.Lock()
		done := r.done
		r.cmd = nil
		r.mu.Unlock()
		<-done
	}
	_ = os.RemoveAll(r.dir)
}

// Do sends one command over a fresh connection using the inline RESP
// protocol and returns the reply as text. It exists so that the helpers (and
// tests checking server state) need no client library; arguments must not
// contain spaces or newlines.
func (r *Redis) Do(args ...string) (string, error) {
	return do(r.Addr, args...)
}

func do(addr string, args ...string) (string, error) {
	return doAuth(addr, "", args...)
}

// doAuth is do after AUTH password on the same connection (none when the
// password is empty).
func doAuth(addr, password string, args ...string) (string, error) {
	if password == "" {
		return doAfter(addr, nil, args...)
	}
	return doAfter(addr, [][]string{{"AUTH", password}}, args...)
}

// ReadReplica is Do after READONLY on the same connection: a Cluster
// replica then answers reads of its master's slots instead of MOVED.
func (r *Redis) ReadReplica(args ...string) (string, error) {
	return doAfter(r.Addr, [][]string{{"READONLY"}}, args...)
}

// doAfter sends the commands before, then args, on one connection and
// returns args' reply; an error reply to one of before fails it.
func doAfter(addr string, before [][]string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	write := func(args ...string) {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	for _, c := range before {
		write(c...)
	}
	write(args...)
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	br := bufio.NewReader(conn)
	for _, c := range before {
		if _, err := readReply(br); err != nil {
			return "", fmt.Errorf("%s: %w", c[0], err)
		}
	}
	return readReply(br)
}

func readReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(br)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func ioReadFull(br *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := br.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freeClusterPort finds a port p where p and its cluster bus port p+10000
// are both free; the kernel's ephemeral ports are often too high for that.
func freeClusterPort() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(20000)
		if portFree(p) && portFree(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair for a cluster node")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// Replica is a redis-server that replicates another.
type Replica struct {
	*Redis
	// Link is the proxy the replication stream passes (nil without lag).
	Link *Proxy
}

// StartReplica starts a redis-server that replicates master and waits
// until it is in sync. With lag > 0 it replicates through a Proxy that
// holds the stream that long and drops what it holds when master dies: a
// replica that lags (see ProxyOptions.DropHeld).
func StartReplica(tb testing.TB, master *Redis, lag time.Duration) *Replica {
	tb.Helper()
	r := &Replica{}
	addr := master.Addr
	if lag > 0 {
		r.Link = StartProxy(tb, master.Addr, ProxyOptions{
			Delay: func(time.Time) time.Duration { return lag }, DelayAfter: "PSYNC", DropHeld: true,
		})
		addr = r.Link.Addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	// The first sync starts at once (Redis waits 5 s by default, for more
	// replicas to share one RDB); the master's later ones are left as they
	// are.
	prev, err := master.Do("CONFIG", "GET", "repl-diskless-sync-delay")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if _, v, ok := strings.Cut(prev, "\n"); ok {
			_, _ = master.Do("CONFIG", "SET", "repl-diskless-sync-delay", v)
		}
	}()
	r.Redis = StartRedis(tb, "--replicaof", host, port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := r.Do("INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("replica %s of %s not in sync after 10s: %q %v", r.Addr, master.Addr, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stateDir makes a directory for a server's files, on a tmpfs (/dev/shm)
// when the machine has one, else in the temporary directory. A cluster
// node rewrites and fsyncs nodes.conf from its event loop at every
// change of the slot map (each SETSLOT NODE of a reshard, on every node
// at once), as a sentinel does its config: on a shared disk one fsync
// took up to 670 ms on an idle machine here, and on a busy one longer
// than the cluster's node timeout, so the nodes stopped answering right
// after a move, marked each other failing and answered CLUSTERDOWN. On
// a tmpfs an fsync returns at once.
func stateDir(prefix string) (string, error) {
	if onTmpfs("/dev/shm") {
		if dir, err := os.MkdirTemp("/dev/shm", prefix); err == nil {
			return dir, nil
		}
	}
	return os.MkdirTemp("", prefix)
}

// onTmpfs tells whether dir is on a tmpfs.
func onTmpfs(dir string) bool {
	const tmpfsMagic = 0x01021994 // TMPFS_MAGIC, linux/magic.h
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == tmpfsMagic
}
