package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// proxyHarness is a served sidecar (no policy applies: these tests are about
// the proxy) in front of app.
func proxyHarness(t *testing.T, app http.Handler, mods ...func(*Options)) (s *Sidecar, front string, upstreamConns *atomic.Int64) {
	t.Helper()
	upstreamConns = new(atomic.Int64)
	up := httptest.NewUnstartedServer(app)
	up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			upstreamConns.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil,
		testPolicy("limited", 1_000_000, withKey("Header", "X-User", "Allow"))))})
	o := testOptions(up.URL, cfg, nil)
	for _, m := range mods {
		m(&o)
	}
	s, err := New(o, newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	front, _ = serve(t, s)
	return s, front, upstreamConns
}

func TestProxyIsTransparent(t *testing.T) {
	var seen *http.Request
	var seenBody []byte
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Clone(context.Background())
		seenBody, _ = io.ReadAll(r.Body)
		w.Header().Set("X-App", "1")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})
	_, front, _ := proxyHarness(t, app)
	req, _ := http.NewRequest("POST", front+"/a%2Fb/c?x=1&y=%20", strings.NewReader("payload"))
	req.Host = "shop.example.com"
	req.Header.Set("X-Forwarded-For", "198.51.100.1")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("X-User", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "created" || len(resp.Header.Values("Set-Cookie")) != 2 || resp.Header.Get("X-App") != "1" {
		t.Errorf("response %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get("RateLimit") == "" {
		t.Error("admitted response without RateLimit")
	}
	if seen.Host != "shop.example.com" || seen.URL.RawPath != "/a%2Fb/c" || seen.URL.RawQuery != "x=1&y=%20" || string(seenBody) != "payload" {
		t.Errorf("app saw Host %q path %q query %q body %q", seen.Host, seen.URL.RawPath, seen.URL.RawQuery, seenBody)
	}
	if got := seen.Header.Get("X-Forwarded-For"); got != "198.51.100.1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q", got)
	}
	if seen.Header.Get("X-Forwarded-Proto") != "https" || seen.Header.Get("Accept-Encoding") != "gzip" || seen.Header.Get("X-User") != "alice" {
		t.Errorf("headers not passed through: %v", seen.Header)
	}
}

func TestProxyKeepAliveAndH2C(t *testing.T) {
	var protos atomic.Value
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos.Store(r.Proto)
		_, _ = io.WriteString(w, "ok")
	})
	_, front, conns := proxyHarness(t, app)

	h1 := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer h1.CloseIdleConnections()
	h2 := &http.Client{Transport: &http.Transport{Protocols: unencryptedHTTP2()}}
	defer h2.CloseIdleConnections()
	for _, c := range []*http.Client{h1, h2} {
		for range 50 {
			resp, err := c.Get(front + "/")
			if err != nil {
				t.Fatal(err)
			}
			drain(resp)
			if c == h2 && resp.ProtoMajor != 2 {
				t.Fatalf("h2c client got %s", resp.Proto)
			}
		}
	}
	if protos.Load() != "HTTP/1.1" {
		t.Errorf("app saw %v, want HTTP/1.1 (default upstream protocol)", protos.Load())
	}
	if n := conns.Load(); n > 4 {
		t.Errorf("100 sequential requests opened %d connections to the app: no keep-alive", n)
	}
}

func unencryptedHTTP2() *http.Protocols {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return p
}

func TestProxyUpstreamH2C(t *testing.T) {
	var proto atomic.Value
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		w.Header().Set("Trailer", "Grpc-Status")
		_, _ = io.WriteString(w, "ok")
		w.Header().Set("Grpc-Status", "0")
	})
	up := httptest.NewUnstartedServer(app)
	up.Config.Protocols = unencryptedHTTP2()
	up.Start()
	t.Cleanup(up.Close)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil))})
	o := testOptions(up.URL, cfg, nil)
	o.UpstreamProtocol = UpstreamAuto
	s, err := New(o, newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	front, _ := serve(t, s)
	c := &http.Client{Transport: &http.Transport{Protocols: unencryptedHTTP2()}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(front + "/svc.Method")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if proto.Load() != "HTTP/2.0" || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("app saw %v, trailer %q: an h2c (gRPC) app needs HTTP/2 and trailers end to end", proto.Load(), resp.Trailer.Get("Grpc-Status"))
	}
}

func TestProxyStreams(t *testing.T) {
	release := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/upload" {
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			_, _ = fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
			return
		}
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "second\n")
	})
	_, front, _ := proxyHarness(t, app)

	// The first chunk arrives while the app still holds the second.
	resp, err := http.Get(front + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk %q %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	_ = resp.Body.Close()
	if string(rest) != "second\n" {
		t.Errorf("second chunk %q", rest)
	}

	// A large upload of unknown length streams through intact.
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < len(data); i += 4096 {
			_, _ = pw.Write(data[i : i+4096])
		}
		_ = pw.Close()
	}()
	resp, err = http.Post(front+"/upload", "application/octet-stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := fmt.Sprintf("%d %x", len(data), sha256.Sum256(data)); string(got) != want {
		t.Errorf("upload: app got %q, want %q", got, want)
	}
}

func TestProxyUpgrade(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "no upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(conn, brw)
	})
	_, front, _ := proxyHarness(t, app)
	conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-User: a\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	defer func() { _ = resp.Body.Close() }() // the body of a 101 is empty; the stream is conn
	if resp.Header.Get("RateLimit") == "" {
		t.Error("the 101 response lacks RateLimit")
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		_, _ = io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %q: got %q %v", msg, got, err)
		}
	}
}

func TestProxyDeadUpstream(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil))})
	s, err := New(testOptions("http://"+addr, cfg, nil), newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	front, _ := serve(t, s)
	resp, err := http.Get(front + "/")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusBadGateway || testutilCounter(s.metrics.upstreamErrors) != 1 {
		t.Errorf("status %d, upstream errors %v", resp.StatusCode, testutilCounter(s.metrics.upstreamErrors))
	}
}

func TestProxyMalformedRequests(t *testing.T) {
	_, front, _ := proxyHarness(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, raw := range []string{
		"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://other/abs?api_key=%ff HTTP/1.1\r\nHost: x\r\nX-User: \x7f\r\n\r\n",
		"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ..\r\nX-Forwarded-For: ,,,[\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab",
		"\x00\x01garbage\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX-User: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(conn, raw)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		_, _ = io.ReadAll(conn)
		_ = conn.Close()
	}
	// Still serving.
	resp, err := http.Get(front + "/")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != 200 {
		t.Errorf("status %d after malformed input", resp.StatusCode)
	}
}

func TestGracefulShutdownDrains(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "done")
	})
	up := httptest.NewServer(app)
	t.Cleanup(up.Close)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("p", 100)))})
	s, err := New(testOptions(up.URL, cfg, nil), newMemLimiter(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	adminLn, _ := net.Listen("tcp", "127.0.0.1:0")
	debugLn, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, adminLn, debugLn) }()

	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		slow <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	<-entered
	cancel() // SIGTERM
	eventually(t, 5*time.Second, "not ready while draining", func() bool { return !s.Ready() })
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with a request in flight", err)
	default:
	}
	eventually(t, 5*time.Second, "the listener closed", func() bool {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
	close(release)
	if got := <-slow; got != "200 done" {
		t.Errorf("in-flight request: %s", got)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestProxyDropsH2CUpgrade: an application that accepts "Upgrade: h2c"
// would turn the connection into an HTTP/2 tunnel that bypasses the limiter.
// The sidecar drops the offer; the request, and the next one on the same
// connection, are plain HTTP/1.1 requests, each decided. WebSocket-style
// upgrades are untouched (TestProxyUpgrade).
func TestProxyDropsH2CUpgrade(t *testing.T) {
	var seen atomic.Value
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(fmt.Sprintf("upgrade=%q settings=%q connection=%q", r.Header.Get("Upgrade"), r.Header.Get("Http2-Settings"), r.Header.Get("Connection")))
		if strings.HasPrefix(strings.ToLower(r.Header.Get("Upgrade")), "h2c") {
			// A lenient server: switch, then keep the connection as a tunnel.
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer func() { _ = conn.Close() }()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + r.Header.Get("Upgrade") + "\r\n\r\n")
			_ = brw.Flush()
			_, _ = io.Copy(conn, brw)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	s, front, _ := proxyHarness(t, app)
	conn, err := net.Dial("tcp", strings.TrimPrefix(front, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	for i, req := range []string{
		// as Java's HttpClient sends it: HTTP2-Settings listed in Connection
		"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-User: a\r\n\r\n",
		// HTTP2-Settings not listed in Connection, so not hop-by-hop
		"GET /b HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: H2C\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-User: a\r\n\r\n",
		// a versioned token
		"GET /c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c/1\r\nX-User: a\r\n\r\n",
		// a draft's name, and parameters a lenient server ignores
		"GET /d HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c-14\r\nX-User: a\r\n\r\n",
		"GET /e HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c;q=1\r\nX-User: a\r\n\r\n",
	} {
		_, _ = io.WriteString(conn, req)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d: %d %q, want 200 ok in HTTP/1.1 (the app saw %v)", i, resp.StatusCode, body, seen.Load())
		}
		if got := seen.Load(); got != `upgrade="" settings="" connection=""` {
			t.Errorf("request %d: the app saw %v, want no upgrade offer", i, got)
		}
	}
	if got := requestsCount(s, "limited", enforce.Allowed); got != 5 {
		t.Errorf("decided requests = %v, want 5: each went through the limiter", got)
	}
}

// TestDropH2CUpgrade sees the outbound headers as ReverseProxy leaves them
// for Rewrite: "Connection: Upgrade" and the client's first Upgrade line.
func TestDropH2CUpgrade(t *testing.T) {
	tests := []struct {
		upgrade     string // "" = no Upgrade header
		settings    bool   // an HTTP2-Settings header not listed in Connection
		wantUpgrade string // "" = no Upgrade and no Connection
	}{
		{upgrade: "h2c", settings: true},
		{upgrade: "H2C"},
		{upgrade: "h2c/1"},
		{upgrade: "h2c-14", settings: true},
		{upgrade: "H2C-16"},
		{upgrade: "h2c;q=1"},
		{upgrade: "h2c ;q=1"},
		{upgrade: "h2cx/2"},
		{upgrade: " h2c-14 , h2c "},
		{upgrade: "websocket", wantUpgrade: "websocket"},
		{upgrade: "websocket, h2c-14", settings: true, wantUpgrade: "websocket"},
		{upgrade: "h2c;q=1, websocket/13, H2C", wantUpgrade: "websocket/13"},
		{upgrade: "xh2c", wantUpgrade: "xh2c"}, // the name decides, not a substring
		{settings: true},                       // HTTP2-Settings alone goes too
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q settings=%v", tt.upgrade, tt.settings), func(t *testing.T) {
			h := http.Header{}
			if tt.upgrade != "" {
				h.Set("Connection", "Upgrade")
				h.Set("Upgrade", tt.upgrade)
			}
			if tt.settings {
				h.Set("Http2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
			}
			dropH2CUpgrade(h)
			wantConnection := ""
			if tt.wantUpgrade != "" {
				wantConnection = "Upgrade"
			}
			if got := h.Get("Upgrade"); got != tt.wantUpgrade {
				t.Errorf("Upgrade = %q, want %q", got, tt.wantUpgrade)
			}
			if got := h.Get("Connection"); got != wantConnection {
				t.Errorf("Connection = %q, want %q", got, wantConnection)
			}
			if got := h.Get("Http2-Settings"); got != "" {
				t.Errorf("Http2-Settings = %q, want none", got)
			}
		})
	}
}
