package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/clienthash"
	"github.com/slidegate/slidegate/internal/debugapi"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestAdminPortAnswersNoDebug: the admin port, which the pod network
// reaches (Prometheus, the kubelet), serves /metrics and the probes and no
// /debug route: a guessed API key must not tell anyone there whether it is
// active, nor /debug/top whom a policy limits. The debug handler does.
func TestAdminPortAnswersNoDebug(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil, testPolicy("per-user", 2, withKey("Header", "X-User", "Deny"))))
	admin, debug := h.s.AdminHandler(), h.s.DebugHandler()
	get := func(hd http.Handler, target string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Header.Set(debugapi.WhyValueHeader, "k-123")
		hd.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, target := range []string{"/debug/why?policy=per-user&source=Header", "/debug/why?policy=per-user&header=k-123",
		"/debug/top?policy=per-user", "/debug/top", "/debug/"} {
		if code, body := get(admin, target); code != http.StatusNotFound {
			t.Errorf("admin port GET %s: %d %q, want 404", target, code, body)
		}
	}
	for _, target := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, _ := get(admin, target); code != http.StatusOK {
			t.Errorf("admin port GET %s: %d", target, code)
		}
	}
	if code, body := get(debug, "/debug/top?policy=per-user"); code != http.StatusOK || !strings.Contains(body, `"hashKeyID"`) {
		t.Errorf("debug port /debug/top: %d %s", code, body)
	}
	if code, _ := get(debug, "/metrics"); code != http.StatusNotFound {
		t.Errorf("debug port /metrics: %d", code)
	}
}

// TestDebugListensOnLoopbackOnly: the sidecar process (Run) serves /debug
// on its loopback debug address, and a client that reaches the pod on any
// other address of the host gets no connection there.
func TestDebugListensOnLoopbackOnly(t *testing.T) {
	other := nonLoopbackAddr(t)
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, testConfig(nil, testPolicy("g", 5)))})
	_, admin, debug := startRunDebug(t, testOptions(newUpstream(t).URL, cfg, nil), testLogger(t))
	resp, err := http.Get("http://" + debug + "/debug/top?policy=g")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("debug port: %d %s", resp.StatusCode, body)
	}
	if resp, err := http.Get(admin + "/debug/top?policy=g"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("admin port /debug/top: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}
	_, port, _ := net.SplitHostPort(debug)
	conn, err := net.Dial("tcp", net.JoinHostPort(other, port))
	if err == nil {
		_ = conn.Close()
		t.Fatalf("the debug port answers on %s too", other)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing the debug port on %s: %v, want connection refused", other, err)
	}
}

// nonLoopbackAddr is an address of this host that is not a loopback one.
func nonLoopbackAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Fatal("this host has no IPv4 address but loopback ones")
	return ""
}

// TestServerTimeouts: every server of the sidecar bounds how long a client
// may take to send its headers and keep an idle connection; the admin and
// debug servers also bound whole requests and answers. The proxied port
// deliberately does not: bodies stream for as long as the application
// wants (uploads, server-sent events, gRPC streams).
func TestServerTimeouts(t *testing.T) {
	h := newHarness(t, newMemLimiter(), testConfig(nil))
	proxied, admin, debug := h.s.servers()
	for name, srv := range map[string]*http.Server{"proxied": proxied, "admin": admin, "debug": debug} {
		if srv.ReadHeaderTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
			t.Errorf("%s: read-header %v, idle %v, max header bytes %d", name, srv.ReadHeaderTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
		}
		streams := name == "proxied"
		if (srv.ReadTimeout > 0) == streams || (srv.WriteTimeout > 0) == streams {
			t.Errorf("%s: read %v, write %v; want none on the proxied port only", name, srv.ReadTimeout, srv.WriteTimeout)
		}
	}
}

// TestHashKeyAppearsLater: a pod that starts before its namespace's key is
// mirrored hashes with a key of its own; when the key file appears (the
// kubelet fills the optional volume later), the sidecar takes it up with
// the config's watch, and /debug/top counts afresh under it.
func TestHashKeyAppearsLater(t *testing.T) {
	const key = "0123456789abcdef0123456789abcdef"
	cfg := newVolume(t)
	cfg.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t,
		testConfig(nil, testPolicy("per-ip", 1, withKey(sidecarconfig.SourceRemoteAddress, "", sidecarconfig.MissingDeny))))})
	o := testOptions(newUpstream(t).URL, cfg, nil)
	o.ConfigResyncInterval = 50 * time.Millisecond
	keyFile := filepath.Join(t.TempDir(), "key", clienthash.SecretDataKey)
	o.ClientHashKeyFile = keyFile
	front, _, debug := startRunDebug(t, o, testLogger(t))
	top := func() debugapi.TopResponse {
		t.Helper()
		resp, err := http.Get("http://" + debug + "/debug/top?policy=per-ip")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var tr debugapi.TopResponse
		if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	limit := func() {
		t.Helper()
		for range 2 { // Redis is down: the fail-open share of 1 admits one
			resp, err := http.Get(front + "/")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
		}
	}
	limit()
	hasher, _ := clienthash.New(key)
	before := top()
	if before.HashKeyID == "" || before.HashKeyID == hasher.ID() || len(before.Items) != 1 || strings.Contains(before.Items[0].Key, "127.0.0.1") {
		t.Fatalf("before the key: %+v", before)
	}
	if err := os.MkdirAll(filepath.Dir(keyFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 10*time.Second, 10*time.Millisecond, "the key taken up", func() error {
		if tr := top(); tr.HashKeyID != hasher.ID() || tr.Total != 0 {
			return fmt.Errorf("%+v", tr)
		}
		return nil
	})
	limit() // the first admit is still in its window: two more 429s
	if after := top(); len(after.Items) != 1 || after.Items[0].Count != 2 || after.Items[0].Key != hasher.Sum(keyPrefixIP+"127.0.0.1") {
		t.Errorf("after the key: %+v, want %s", after, hasher.Sum(keyPrefixIP+"127.0.0.1"))
	}
}
