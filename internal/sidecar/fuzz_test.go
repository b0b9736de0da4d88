package sidecar

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// FuzzRequestKey feeds arbitrary raw requests and peer addresses through the
// request-to-key path (policy match, client address with forwarding
// headers, header, query and JWT keys) and the whole handler. The seed
// corpus is in testdata/fuzz/FuzzRequestKey; run the fuzzer with
//
//	go test ./internal/sidecar -run '^$' -fuzz FuzzRequestKey -fuzztime 1m
func FuzzRequestKey(f *testing.F) {
	f.Add([]byte("GET /api/x?api_key=k HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4, 10.0.0.2\r\n\r\n"), "10.0.0.1:5000")
	f.Add([]byte("GET /api/x?api_key=a&api_key=b HTTP/1.1\r\nHost: a\r\nX-User: a\r\nX-User: b\r\n\r\n"), "10.0.0.1:5000")
	f.Add([]byte("POST /login HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer "+jwt(`{"sub":"alice"}`)+"\r\nContent-Length: 0\r\n\r\n"), "[::1]:80")

	cfg := testConfig([]string{"10.0.0.0/8", "::1/128"},
		testPolicy("a-ip", 3, withKey("RemoteAddress", "", "Deny")),
		testPolicy("b-header", 3, withKey("Header", "X-User", "Deny")),
		testPolicy("c-query", 3, withKey("QueryParameter", "api_key", "RemoteAddress")),
		testPolicy("d-jwt", 3, withKey("JWTClaim", "sub", "Allow"), dryRun),
		testPolicy("e-global", 1000, func(p *sidecarconfig.Policy) {
			p.Match = sidecarconfig.Match{Methods: []string{"POST"}, PathPrefixes: []string{"/api/", "/login"}}
		}),
	)
	st, err := compile(cfg, nil, [32]byte{}, [32]byte{})
	if err != nil {
		f.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	vol := newVolume(f)
	vol.write(f, map[string][]byte{sidecarconfig.FileName: marshalConfig(f, cfg)})
	s, err := New(testOptions(up.URL, vol, nil), newMemLimiter(), testLogger(f))
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, raw []byte, peer string) {
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return
		}
		r.RemoteAddr = peer
		peerAddr, peerOK := parsePeer(peer)
		for _, p := range st.policies {
			ri := reqInfo{r: r, trusted: st.trusted}
			_ = p.matches(&ri)
			key, ks := ri.key(p)
			again := reqInfo{r: r, trusted: st.trusted}
			key2, ks2 := again.key(p)
			if key != key2 || ks != ks2 {
				t.Fatalf("%s: not deterministic: %q/%v then %q/%v", p.name, key, ks, key2, ks2)
			}
			switch {
			case ks == keyMissing && (p.source == sidecarconfig.SourceRemoteAddress || p.source == sidecarconfig.SourceGlobal || p.onMissing == sidecarconfig.MissingRemoteAddress):
				t.Fatalf("%s: no key", p.name)
			case ks == keyAmbiguous && (p.source == sidecarconfig.SourceRemoteAddress || p.source == sidecarconfig.SourceGlobal):
				t.Fatalf("%s: ambiguous key", p.name)
			case ks != keyFound:
				continue
			}
			// More than one value, as Go's own parsers see the request, is
			// never a client key (issue 23).
			if p.source == sidecarconfig.SourceHeader && len(r.Header.Values(p.keyName)) > 1 ||
				p.source == sidecarconfig.SourceQueryParameter && len(queryAsGoParses(r.URL.RawQuery)[p.keyName]) > 1 {
				t.Fatalf("%s: keyed on one of several values: %q", p.name, key)
			}
			if len(key) > 64 || !utf8.ValidString(key) || strings.ContainsAny(key, "{}\r\n\x00 ") {
				t.Fatalf("%s: unsafe key %q", p.name, key)
			}
			if p.source == sidecarconfig.SourceRemoteAddress && peerOK && !st.trusted.contains(peerAddr) && key != addressKey(peerAddr, p.ipv6Bits) {
				t.Fatalf("untrusted peer %s got key %q from its headers", peer, key)
			}
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, r)
		switch rec.Code {
		case 200, 400, 429, 502:
		default:
			t.Fatalf("status %d", rec.Code)
		}
	})
}

// queryAsGoParses is the query as net/url reads it (pairs with a ';' are
// dropped there).
func queryAsGoParses(raw string) url.Values {
	v, _ := url.ParseQuery(raw)
	return v
}

// FuzzDropH2CUpgrade: whatever the client's Upgrade line, no h2c offer
// reaches the application and every other token does, in order.
//
//	go test ./internal/sidecar -run '^$' -fuzz FuzzDropH2CUpgrade -fuzztime 1m
func FuzzDropH2CUpgrade(f *testing.F) {
	for _, s := range []string{"h2c", "websocket, h2c-14", "H2C;q=1,,echo/2", " h2c/1 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, upgrade string) {
		h := http.Header{"Connection": {"Upgrade"}, "Upgrade": {upgrade}}
		dropH2CUpgrade(h)
		var want []string
		for _, tok := range strings.Split(upgrade, ",") {
			if tok = strings.TrimSpace(tok); tok != "" && !strings.HasPrefix(strings.ToLower(tok), "h2c") {
				want = append(want, tok)
			}
		}
		var got []string
		for _, v := range h.Values("Upgrade") {
			for _, tok := range strings.Split(v, ",") {
				if tok = strings.TrimSpace(tok); tok != "" {
					got = append(got, tok)
				}
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("Upgrade %q became %q, want %q", upgrade, got, want)
		}
	})
}
