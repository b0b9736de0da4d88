package sidecar

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// readRequest parses a request with the request-target exactly as written
// (a backslash or a ';' stays as it came), as the sidecar's server does;
// nil when Go's server would refuse it.
func readRequest(method, target string, header http.Header) *http.Request {
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: app\r\n")
	for k, vs := range header {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	b.WriteString("\r\n")
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(b.String())))
	if err != nil {
		return nil
	}
	return r
}

func withMatch(m sidecarconfig.Match) func(*sidecarconfig.Policy) {
	return func(p *sidecarconfig.Policy) { p.Match = m }
}

// TestMatchWaysAround: the methods and paths of issue 23 that slipped past
// a policy, and the ones that were already caught and must stay so. New
// cases go at the end of their group.
func TestMatchWaysAround(t *testing.T) {
	get := sidecarconfig.Match{Methods: []string{"GET"}}
	del := sidecarconfig.Match{Methods: []string{"DELETE"}}
	api := sidecarconfig.Match{PathPrefixes: []string{"/api/"}}
	apiFold := sidecarconfig.Match{PathPrefixes: []string{"/api/"}, PathCase: sidecarconfig.PathCaseInsensitive}
	tests := []struct {
		match          sidecarconfig.Match
		method, target string
		header         http.Header
		want           bool
	}{
		// Methods: HEAD runs the GET handler; letter case is lenient.
		{get, "GET", "/", nil, true},
		{get, "HEAD", "/", nil, true},
		{get, "get", "/", nil, true},
		{get, "Head", "/", nil, true},
		{get, "POST", "/", nil, false},
		{sidecarconfig.Match{Methods: []string{"HEAD"}}, "GET", "/", nil, false},
		// Method overrides count as the method they name.
		{del, "POST", "/", http.Header{"X-Http-Method-Override": {"DELETE"}}, true},
		{del, "POST", "/", http.Header{"X-Http-Method-Override": {"delete"}}, true},
		{del, "POST", "/", http.Header{"X-Http-Method": {"DELETE"}}, true},
		{del, "POST", "/", http.Header{"X-Method-Override": {"PUT, DELETE"}}, true},
		{del, "POST", "/?_method=DELETE", nil, true},
		{del, "POST", "/?a=1&_method=delete", nil, true},
		{del, "POST", "/?a=1;_method=DELETE", nil, true},
		{del, "POST", "/", http.Header{"X-Http-Method-Override": {"PATCH"}}, false},
		{del, "POST", "/?_method=PATCH&method=DELETE", nil, false},
		{get, "POST", "/", http.Header{"X-Http-Method-Override": {"HEAD"}}, true},

		// Paths, against "/api/". Caught before issue 23, kept.
		{api, "GET", "/api/users", nil, true},
		{api, "GET", "//api/users", nil, true},
		{api, "GET", "/x/../api/users", nil, true},
		{api, "GET", "/api%2Fusers", nil, true},
		{api, "GET", "/%61pi/users", nil, true},
		{api, "GET", "/./api/", nil, true},
		{api, "GET", "/api", nil, false},
		{api, "GET", "/apis/x", nil, false},
		{api, "GET", "/public/x", nil, false},
		{api, "GET", "/API/users", nil, false}, // case-sensitive unless asked
		// Issue 23: segment parameters (Tomcat, Spring, Jetty route both to
		// /api/users), backslashes.
		{api, "GET", "/api;jsessionid=1/users", nil, true},
		{api, "GET", "/.;/api/users", nil, true},
		{api, "GET", `/api\users`, nil, true},
		{api, "GET", "/api%5Cusers", nil, true},
		{api, "GET", `/\api\users`, nil, true},
		{api, "GET", "/api/users/..", nil, true},              // Tomcat: "/api/"
		{api, "GET", `/api/users;x\..\..\admin`, nil, true},   // Tomcat: "/api/users"
		{api, "GET", "/api/..;/admin", nil, true},             // Go's mux: under /api/
		{api, "GET", "/api;a%2F..%2F..%2Fb/users", nil, true}, // Tomcat: "/api/users"
		{api, "GET", "/api%3Bx/users", nil, false},            // an encoded ';' is no parameter
		{api, "GET", "/x;/../api/users", nil, true},
		{api, "GET", "/admin;/api/users", nil, false},
		// Issue 36: decoded once, as the servers above route; an app that
		// decodes twice reads "/api/users" where the policy saw "/%61pi".
		{api, "GET", "/%2561pi/users", nil, false},
		// Issue 23: the opt-in case-insensitive prefix.
		{apiFold, "GET", "/API/users", nil, true},
		{apiFold, "GET", "/Api;v=1/users", nil, true},
		{apiFold, "GET", `/aPI\users`, nil, true},
		{apiFold, "GET", "/%41PI/users", nil, true},
		{apiFold, "GET", "/ap%C4%B1/users", nil, true}, // dotless ı: .NET upper-cases it to I
		{apiFold, "GET", "/APIS/users", nil, false},
		{sidecarconfig.Match{PathPrefixes: []string{"/Admin/"}, PathCase: sidecarconfig.PathCaseInsensitive}, "GET", "/aDMIN/x", nil, true},
	}
	for _, tt := range tests {
		name := tt.method + " " + tt.target
		p := compiledPolicy(t, testPolicy("p", 1, withMatch(tt.match)))
		r := readRequest(tt.method, tt.target, tt.header)
		if r == nil {
			t.Fatalf("%s: Go's server refuses the request", name)
		}
		if got := p.matches(&reqInfo{r: r}); got != tt.want {
			t.Errorf("%s %v against %+v: matches = %v, want %v", name, tt.header, tt.match, got, tt.want)
		}
	}
}

func TestNormalizePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/", "/"},
		{"", "/"},
		{"/api/users", "/api/users"},
		{"/api/users/", "/api/users/"},
		{"//api//users", "/api/users"},
		{"/a/./b", "/a/b"},
		{"/a/b/..", "/a/"},
		{"/a/b/.", "/a/b/"},
		{"/a/b/../../..", "/"},
		{"/../../a", "/a"},
		{`\a\b`, "/a/b"},
		{"/a/..b/c", "/a/..b/c"},
		{"*", "/*"},
	}
	for _, tt := range tests {
		if got := normalizePath(tt.in); got != tt.want {
			t.Errorf("normalizePath(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestStripSegmentParams(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/api/users", "/api/users"},
		{"/api;jsessionid=1/users", "/api/users"},
		{"/.;/api", "/./api"},
		{"/a;x;y/b;z", "/a/b"},
		{"/a;", "/a"},
		{"/a%3Bx/b", "/a%3Bx/b"},
	}
	for _, tt := range tests {
		if got := stripSegmentParams(tt.in); got != tt.want {
			t.Errorf("stripSegmentParams(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestFoldCase: letters that a case-insensitive router may take for one
// another fold alike; others do not.
func TestFoldCase(t *testing.T) {
	same := [][2]string{{"/api/", "/API/"}, {"/k", "/\u212a"}, {"/i", "/\u0131"}, {"/i", "/\u0130"}, {"/s", "/\u017f"}, {"/σ", "/ς"}}
	for _, s := range same {
		if foldCase(s[0]) != foldCase(s[1]) {
			t.Errorf("%q and %q fold to %q and %q", s[0], s[1], foldCase(s[0]), foldCase(s[1]))
		}
	}
	for _, d := range [][2]string{{"/api/", "/apj/"}, {"/a-b", "/a_b"}} {
		if foldCase(d[0]) == foldCase(d[1]) {
			t.Errorf("%q and %q fold alike", d[0], d[1])
		}
	}
}

// servletConfig is a Tomcat HTTP connector's URI settings (the attributes
// of the same names, "HTTP Connector" in Tomcat's configuration reference).
type servletConfig struct {
	allowBackslash bool
	// encodedSolidusHandling is reject (the default), decode or
	// passthrough: what an encoded "/" (%2F) becomes.
	encodedSolidusHandling string
}

var servletConfigs = []servletConfig{
	{false, "reject"}, {false, "decode"}, {false, "passthrough"},
	{true, "reject"}, {true, "decode"}, {true, "passthrough"},
}

// servletPath is the path Tomcat maps a request-target to a servlet by, ok
// false for one it refuses with 400: a model written from Tomcat's
// documentation and CoyoteAdapter.postParseRequest, independent of the
// sidecar's code. In order: path parameters (from each ';' to the next
// '/') are removed from the undecoded path; it is %-decoded (a malformed
// escape, or %00, is refused; %2F per encodedSolidusHandling); then
// normalised: a '\' becomes '/' with allowBackslash and is refused
// without, "//" is merged, a trailing "/." or "/.." gets a '/', "/./" is
// removed and "/../" removes the segment before it, refused at the root.
func servletPath(target string, c servletConfig) (string, bool) {
	p, _, _ := strings.Cut(target, "?")
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	// Path parameters.
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == ';' {
			for i < len(p) && p[i] != '/' {
				i++
			}
			if i == len(p) {
				break
			}
		}
		b.WriteByte(p[i])
	}
	p = b.String()
	// Decoding.
	b.Reset()
	for i := 0; i < len(p); i++ {
		if p[i] != '%' {
			b.WriteByte(p[i])
			continue
		}
		if i+2 >= len(p) {
			return "", false
		}
		v, err := strconv.ParseUint(p[i+1:i+3], 16, 8)
		if err != nil || v == 0 {
			return "", false
		}
		if v == '/' {
			switch c.encodedSolidusHandling {
			case "reject":
				return "", false
			case "passthrough":
				b.WriteString(p[i : i+3])
				i += 2
				continue
			}
		}
		b.WriteByte(byte(v))
		i += 2
	}
	p = b.String()
	// Normalisation.
	if strings.Contains(p, `\`) {
		if !c.allowBackslash {
			return "", false
		}
		p = strings.ReplaceAll(p, `\`, "/")
	}
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	if strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
		p += "/"
	}
	for strings.Contains(p, "/./") {
		p = strings.Replace(p, "/./", "/", 1)
	}
	for {
		i := strings.Index(p, "/../")
		if i < 0 {
			break
		}
		if i == 0 {
			return "", false
		}
		j := strings.LastIndexByte(p[:i], '/')
		p = p[:j] + p[i+3:]
	}
	return p, true
}

func TestServletPathModel(t *testing.T) {
	def := servletConfig{false, "reject"}
	tests := []struct {
		target string
		c      servletConfig
		want   string // "" refused
	}{
		{"/api/users", def, "/api/users"},
		{"/api;jsessionid=1/users", def, "/api/users"},
		{"/.;/api/users", def, "/api/users"},
		{"/api/users/..", def, "/api/"},
		{"/api%2Fusers", def, ""},
		{"/api%2Fusers", servletConfig{false, "decode"}, "/api/users"},
		{"/api%2Fusers", servletConfig{false, "passthrough"}, "/api%2Fusers"},
		{`/api\users`, def, ""},
		{`/api\users`, servletConfig{true, "reject"}, "/api/users"},
		{`/api/users;x\..\..\admin`, def, "/api/users"},
		{"/../api", def, ""},
		{"/a%00", def, ""},
		{"/a%3Bx/b?q=1", def, "/a;x/b"},
	}
	for _, tt := range tests {
		got, ok := servletPath(tt.target, tt.c)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("servletPath(%q, %+v) = %q, %v; want %q", tt.target, tt.c, got, ok, tt.want)
		}
	}
}

// hasPrefixFold reports whether s begins with prefix, rune by rune under
// Unicode simple case folding (strings.EqualFold).
func hasPrefixFold(s, prefix string) bool {
	for _, pr := range prefix {
		r, n := utf8.DecodeRuneInString(s)
		if n == 0 || !strings.EqualFold(string(r), string(pr)) {
			return false
		}
		s = s[n:]
	}
	return true
}

// underFolded reports whether a case-insensitive router could take p to be
// under prefix: by simple case folding, or by comparing the upper-case
// (.NET's OrdinalIgnoreCase) or the lower-case forms.
func underFolded(p, prefix string) bool {
	return hasPrefixFold(p, prefix) ||
		strings.HasPrefix(strings.ToUpper(p), strings.ToUpper(prefix)) ||
		strings.HasPrefix(strings.ToLower(p), strings.ToLower(prefix))
}

// FuzzPathForms: any request that Go's net/http ServeMux or a Servlet
// container (Tomcat, in each of its URI settings) would route under the
// protected prefix "/api/" is matched by a policy with that prefix, and a
// case-insensitive router's reading by a policy with pathCase Insensitive.
// The application sees the request the sidecar forwards: the target is
// parsed by Go's server (the sidecar's), written out again as the reverse
// proxy does (URL.RequestURI) and routed from there. Seeds are the paths
// of issue 23; run the fuzzer with
//
//	go test ./internal/sidecar -run '^$' -fuzz FuzzPathForms -fuzztime 1m
func FuzzPathForms(f *testing.F) {
	for _, s := range []string{
		"/api/users", "/api;jsessionid=1/users", "/.;/api/users", "/API/users", `/api\users`,
		"//api/users", "/x/../api/users", "/api%2Fusers", "/%61pi/users", "/api/users/..",
		`/api/users;x\..\..\admin`, "/api/..;/admin", "/api;a%2F..%2F..%2Fb/users", "/x;/../api/",
		"/%2e%2e/api/x", "/.%2e/api/x", "/api/%2e%2e/x", `\api/x`, "/ap%C4%B1/x", "/x/..;/api/y",
	} {
		f.Add("GET", s)
	}
	f.Add("HEAD", "/api/")
	f.Add("POST", "/api;x/users")

	policy := compiledPolicy(f, testPolicy("p", 1, withMatch(sidecarconfig.Match{Methods: []string{"GET"}, PathPrefixes: []string{"/api/"}})))
	folded := compiledPolicy(f, testPolicy("p", 1, withMatch(sidecarconfig.Match{PathPrefixes: []string{"/api/"}, PathCase: sidecarconfig.PathCaseInsensitive})))
	anyMethod := compiledPolicy(f, testPolicy("p", 1, withMatch(sidecarconfig.Match{PathPrefixes: []string{"/api/"}})))

	upstreamURL := &url.URL{Scheme: "http", Host: "127.0.0.1:8080"}
	var routed bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/", func(http.ResponseWriter, *http.Request) { routed = true })
	mux.HandleFunc("/", func(http.ResponseWriter, *http.Request) {})

	f.Fuzz(func(t *testing.T, method, target string) {
		r := readRequest(method, target, nil)
		if r == nil || r.Method == http.MethodConnect || r.URL.Opaque != "" {
			return // refused by the sidecar's server; no path to route by
		}
		// What the sidecar's reverse proxy sends (newProxy: SetURL).
		pr := &httputil.ProxyRequest{In: r, Out: r.Clone(r.Context())}
		pr.SetURL(upstreamURL)
		forwarded := pr.Out.URL.RequestURI()
		app := readRequest(r.Method, forwarded, nil)
		if app == nil {
			t.Fatalf("%q is forwarded as %q, which Go's server refuses", target, forwarded)
		}
		matched := policy.matches(&reqInfo{r: r})

		routed = false
		mux.ServeHTTP(httptest.NewRecorder(), app)
		if routed && !matched {
			t.Fatalf("%s %q (forwarded as %q): Go's mux routes it under /api/, the policy does not match", method, target, forwarded)
		}

		anyMatched := anyMethod.matches(&reqInfo{r: r})
		foldMatched := folded.matches(&reqInfo{r: r})
		for _, c := range servletConfigs {
			for _, tgt := range []string{target, forwarded} {
				p, ok := servletPath(tgt, c)
				if !ok {
					continue
				}
				if strings.HasPrefix(p, "/api/") && !anyMatched {
					t.Fatalf("%q (forwarded as %q): Tomcat %+v routes it to %q, the policy does not match", target, forwarded, c, p)
				}
				if underFolded(p, "/api/") && !foldMatched {
					t.Fatalf("%q (forwarded as %q): a case-insensitive servlet path %q, the Insensitive policy does not match", target, forwarded, p)
				}
			}
		}
		// A case-insensitive router on the decoded path, cleaned as Go
		// cleans it.
		for _, p := range []string{app.URL.Path, goClean(app.URL.Path)} {
			if underFolded(p, "/api/") && !foldMatched {
				t.Fatalf("%q (forwarded as %q): a case-insensitive router reads %q, the Insensitive policy does not match", target, forwarded, p)
			}
		}
	})
}

// goClean is the path Go's ServeMux routes by (it redirects to it).
func goClean(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}
