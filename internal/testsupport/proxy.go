package testsupport

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ProxyOptions shape the traffic of a Proxy.
type ProxyOptions struct {
	// Listen is the address to listen on (default 127.0.0.1:0).
	Listen string
	// Delay is how long to hold a chunk of the server's replies that
	// arrived at t (nil: no delay). Chunks keep their order: one is never
	// written before an earlier one.
	Delay func(t time.Time) time.Duration
	// DelayAfter, when set, limits Delay to the connections that have sent
	// a request chunk containing it (ASCII case-insensitive), from then
	// on: "PSYNC" delays a replica's replication stream and no client's
	// replies.
	DelayAfter string
	// DropHeld drops the replies still held (by Delay) when the server
	// closes the connection, instead of delivering them: a server that
	// dies (kill -9) takes with it what it had not sent yet, which is what
	// a lagging replica loses at a failover.
	DropHeld bool
	// DropAfter, once Arm is called, marks the first request chunk that
	// contains it (ASCII case-insensitive): the server's next reply on that
	// connection is swallowed and the connection closed, a reply lost after
	// the command ran.
	DropAfter string
}

// Proxy is a TCP proxy on loopback in front of a server (a redis-server),
// for tests of a slow or lossy network.
type Proxy struct {
	Addr    string
	opts    ProxyOptions
	ln      net.Listener
	armed   atomic.Bool
	dropped atomic.Int32
	held    atomic.Bool
	// lastDelivered is when the server sent the newest delayed chunk that
	// reached the other side (UnixNano).
	lastDelivered atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// StartProxy forwards every connection to Proxy.Addr to target until the
// test ends.
func StartProxy(tb testing.TB, target string, o ProxyOptions) *Proxy {
	tb.Helper()
	p, err := NewProxy(target, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// NewProxy is StartProxy outside a test (TestMain); the caller closes it.
func NewProxy(target string, o ProxyOptions) (*Proxy, error) {
	addr := o.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), opts: o, ln: ln, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	return p, nil
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Hold stops (true) or resumes (false) the delivery of delayed replies:
// while held, a replica receives nothing more, and what it would have
// received is lost if the server dies meanwhile (DropHeld). It is a
// replica fallen behind at the worst moment, made certain.
func (p *Proxy) Hold(on bool) { p.held.Store(on) }

// Arm drops the reply to the next request that contains DropAfter.
func (p *Proxy) Arm() { p.armed.Store(true) }

// Dropped is how many replies were dropped.
func (p *Proxy) Dropped() int32 { return p.dropped.Load() }

// LastDelivered is when the server sent the newest delayed reply chunk
// that was delivered (zero if none): whatever the server wrote on a
// delayed connection after it was still held when the connection ended.
func (p *Proxy) LastDelivered() time.Time {
	if n := p.lastDelivered.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func (p *Proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

// link is one client connection through the proxy: c the client's, s the
// server's, and what the client's bytes armed: poisoned (DropAfter
// matched: the server's next bytes close c instead) and delayed
// (DelayAfter matched, or none set: Delay applies).
type link struct {
	p                 *Proxy
	c, s              net.Conn
	poisoned, delayed atomic.Bool
}

// chunk is bytes the server sent, read at read, to be delivered at at.
type chunk struct {
	b        []byte
	read, at time.Time
	delayed  bool
}

func (p *Proxy) serve(c net.Conn, target string) {
	p.track(c, true)
	defer p.track(c, false)
	defer func() { _ = c.Close() }()
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer func() { _ = s.Close() }()
	l := &link{p: p, c: c, s: s}
	l.delayed.Store(p.opts.DelayAfter == "")
	go l.toServer()
	q := make(chan chunk, 1024)
	serverGone := make(chan struct{})
	go l.fromServer(q, serverGone)
	l.deliver(q, serverGone)
}

// toServer copies the client's bytes to the server, arming poisoned and
// delayed when they match.
func (l *link) toServer() {
	defer func() { _ = l.s.Close() }()
	match := bytes.ToLower([]byte(l.p.opts.DropAfter))
	delayMatch := bytes.ToLower([]byte(l.p.opts.DelayAfter))
	buf := make([]byte, 64<<10)
	for {
		n, err := l.c.Read(buf)
		if n > 0 {
			lower := bytes.ToLower(buf[:n])
			if len(match) > 0 && bytes.Contains(lower, match) && l.p.armed.CompareAndSwap(true, false) {
				l.poisoned.Store(true)
			}
			if len(delayMatch) > 0 && bytes.Contains(lower, delayMatch) {
				l.delayed.Store(true)
			}
			if _, err := l.s.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fromServer reads the server's bytes into q, each with the time it is
// due (never before the one before it), until the server goes
// (serverGone) or a poisoned link drops the client.
func (l *link) fromServer(q chan<- chunk, serverGone chan<- struct{}) {
	defer close(q)
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := l.s.Read(buf)
		if n > 0 {
			if l.poisoned.Load() {
				l.p.dropped.Add(1)
				_ = l.c.Close()
				return
			}
			read := time.Now()
			at := read
			d := l.p.opts.Delay != nil && l.delayed.Load()
			if d {
				at = at.Add(l.p.opts.Delay(at))
			}
			at = maxTime(at, last)
			last = at
			q <- chunk{b: buf[:n], read: read, at: at, delayed: d}
		}
		if err != nil {
			close(serverGone)
			return
		}
	}
}

// deliver writes each chunk of q to the client when it is due, and while
// the proxy holds delayed bytes, not before; with DropHeld, what is still
// due or held when the server goes is dropped.
func (l *link) deliver(q <-chan chunk, serverGone <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	gone := serverGone
	for ch := range q {
		timer.Reset(time.Until(ch.at))
		select {
		case <-timer.C:
		case <-gone:
			// What was due by now was on its way already.
			if l.p.opts.DropHeld && time.Now().Before(ch.at) {
				return
			}
			<-timer.C
		}
		for ch.delayed && l.p.held.Load() {
			select {
			case <-gone:
				if l.p.opts.DropHeld {
					return
				}
				gone = nil // gone: only the hold matters now
			case <-time.After(time.Millisecond):
			}
		}
		if _, err := l.c.Write(ch.b); err != nil {
			return
		}
		if ch.delayed {
			l.p.lastDelivered.Store(ch.read.UnixNano())
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
