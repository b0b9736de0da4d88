package testsupport

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// ProxyOptions shape the traffic of a Proxy.
type ProxyOptions struct {
	// Delay is how long to hold a chunk of the server's replies that
	// arrived at t (nil: no delay). Chunks keep their order: one is never
	// written before an earlier one.
	Delay func(t time.Time) time.Duration
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
	armed   atomic.Bool
	dropped atomic.Int32
}

// StartProxy forwards every connection to Proxy.Addr to target until the
// test ends.
func StartProxy(tb testing.TB, target string, o ProxyOptions) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	p := &Proxy{Addr: ln.Addr().String(), opts: o}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	return p
}

// Arm drops the reply to the next request that contains DropAfter.
func (p *Proxy) Arm() { p.armed.Store(true) }

// Dropped is how many replies were dropped.
func (p *Proxy) Dropped() int32 { return p.dropped.Load() }

func (p *Proxy) serve(c net.Conn, target string) {
	defer func() { _ = c.Close() }()
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer func() { _ = s.Close() }()
	var poisoned atomic.Bool
	match := bytes.ToLower([]byte(p.opts.DropAfter))
	go func() {
		defer func() { _ = s.Close() }()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if len(match) > 0 && bytes.Contains(bytes.ToLower(buf[:n]), match) && p.armed.CompareAndSwap(true, false) {
					poisoned.Store(true)
				}
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := s.Read(buf)
			if n > 0 {
				if poisoned.Load() {
					p.dropped.Add(1)
					_ = c.Close()
					return
				}
				at := time.Now()
				if p.opts.Delay != nil {
					at = at.Add(p.opts.Delay(at))
				}
				at = maxTime(at, last)
				last = at
				q <- chunk{buf[:n], at}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range q {
		time.Sleep(time.Until(ch.at))
		if _, err := c.Write(ch.b); err != nil {
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
