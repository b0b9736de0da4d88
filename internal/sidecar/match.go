package sidecar

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Which requests a policy applies to. For a limit, matching too much is
// safe and matching too little is a way around it: a request matches when
// any reading of it that an application server routes by matches, so a
// client cannot pick a spelling that the application serves and the policy
// does not see. The request is forwarded unchanged; these readings are
// used for matching only.

// matches reports whether the policy applies to a request's method and
// path. Empty lists match everything.
func (p *policy) matches(ri *reqInfo) bool {
	return p.matchesMethod(ri) && p.matchesPath(ri)
}

// Methods.

// methodOverrideHeaders are the headers that frameworks take as a request's
// method instead of its own (Rails, Laravel and Symfony, Spring, ASP.NET
// Core, Express's method-override, Google's APIs), in canonical form.
var methodOverrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// methodOverrideParam is the query parameter that Spring's
// HiddenHttpMethodFilter and Symfony take as the method (Rails reads it
// from a form body only, which the sidecar does not read).
const methodOverrideParam = "_method"

// compileMethods is a policy's method list as it is matched: upper case,
// with HEAD wherever GET is, since Go's mux, Express, Flask, Rails and
// Spring run the GET handler for HEAD.
func compileMethods(ms []string) []string {
	out := make([]string, 0, len(ms)+1)
	for _, m := range ms {
		out = append(out, strings.ToUpper(m))
	}
	if slices.Contains(out, http.MethodGet) && !slices.Contains(out, http.MethodHead) {
		out = append(out, http.MethodHead)
	}
	return out
}

// matchesMethod reports whether the request's method, in any letter case
// (lenient servers route "get" as GET), or a method it asks for with an
// override header or query parameter, is one of the policy's.
func (p *policy) matchesMethod(ri *reqInfo) bool {
	if len(p.methods) == 0 || p.listsMethod(ri.r.Method) {
		return true
	}
	for _, h := range methodOverrideHeaders {
		for _, v := range ri.r.Header[h] {
			for m := range strings.SplitSeq(v, ",") {
				if p.listsMethod(strings.TrimSpace(m)) {
					return true
				}
			}
		}
	}
	found := false
	queryParams(ri.r.URL.RawQuery, func(name, value string) bool {
		found = sameParamName(name, methodOverrideParam) && p.listsMethod(strings.TrimSpace(value))
		return !found
	})
	return found
}

func (p *policy) listsMethod(m string) bool {
	for _, pm := range p.methods {
		if strings.EqualFold(pm, m) {
			return true
		}
	}
	return false
}

// Paths.

// matchesPath reports whether one of the policy's prefixes begins one of
// the request's path forms (see pathForms), ignoring letter case when the
// policy says so.
func (p *policy) matchesPath(ri *reqInfo) bool {
	if len(p.prefixes) == 0 {
		return true
	}
	u := ri.r.URL
	if !p.foldCase {
		// The usual case first, without computing anything.
		if hasAnyPrefix(u.Path, p.prefixes) {
			return true
		}
	}
	for _, f := range ri.pathForms(p.foldCase) {
		if hasAnyPrefix(f, p.prefixes) {
			return true
		}
	}
	return false
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, pre := range prefixes {
		if strings.HasPrefix(s, pre) {
			return true
		}
	}
	return false
}

// pathForms are the readings of a request's path that prefixes are matched
// against, computed once per request (and once more, case-folded, when a
// policy ignores case):
//
//   - the path as received, decoded (URL.Path) and raw (URL.RawPath, when
//     it differs);
//   - the decoded path normalised (normalizePath): "\" read as "/", dot
//     segments and repeated slashes resolved, as Go's mux, nginx and most
//     routers clean it;
//   - the same after removing segment parameters (";jsessionid=1") from the
//     raw path before decoding it, as Servlet containers (Tomcat, Jetty,
//     Spring) do, so "/api;x=1/users" and "/.;/api/users" are "/api/users".
//
// Both normalised forms are kept: a parameter removed can hide a ".."
// ("/api/..;/x", which Go's mux serves under /api/) and a parameter kept
// can hide a segment boundary; between them, every path that one of these
// servers routes under a prefix has a form that begins with it
// (FuzzPathForms).
func (ri *reqInfo) pathForms(fold bool) []string {
	if !ri.formsDone {
		ri.formsDone = true
		u := ri.r.URL
		ri.forms = appendNew(ri.forms[:0], u.Path)
		ri.forms = appendNew(ri.forms, u.RawPath)
		ri.forms = appendNew(ri.forms, normalizePath(u.Path))
		ri.forms = appendNew(ri.forms, normalizePath(decodePath(stripSegmentParams(rawPath(u)), u.Path)))
	}
	if !fold {
		return ri.forms
	}
	if !ri.foldedDone {
		ri.foldedDone = true
		for _, f := range ri.forms {
			ri.folded = appendNew(ri.folded, foldCase(f))
		}
	}
	return ri.folded
}

// appendNew appends s to forms unless it is empty or already there.
func appendNew(forms []string, s string) []string {
	if s == "" || slices.Contains(forms, s) {
		return forms
	}
	return append(forms, s)
}

// rawPath is the path as it came on the wire, still escaped.
func rawPath(u *url.URL) string {
	if u.RawPath != "" {
		// url.Parse keeps the raw path whenever it is not the default
		// escaping of the decoded one, even when EscapedPath would not
		// use it (it holds bytes that should have been escaped).
		return u.RawPath
	}
	return u.EscapedPath()
}

// stripSegmentParams removes every segment parameter (from ';' to the end
// of its segment) of a raw path, as Servlet containers do before decoding:
// a ';' that arrives encoded (%3B) stays.
func stripSegmentParams(p string) string {
	if !strings.Contains(p, ";") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for p != "" {
		i := strings.IndexByte(p, ';')
		if i < 0 {
			b.WriteString(p)
			break
		}
		b.WriteString(p[:i])
		p = p[i:]
		if j := strings.IndexByte(p, '/'); j >= 0 {
			p = p[j:]
		} else {
			p = ""
		}
	}
	return b.String()
}

// decodePath percent-decodes a raw path, "%2F" to "/" included (Tomcat's
// encodedSolidusHandling=decode); fallback is used if it does not decode.
func decodePath(raw, fallback string) string {
	if !strings.Contains(raw, "%") {
		return raw
	}
	d, err := url.PathUnescape(raw)
	if err != nil {
		return fallback
	}
	return d
}

// normalizePath is a decoded path with "\" read as "/" (Windows servers,
// and Tomcat with allowBackslash), repeated slashes merged and dot segments
// resolved (RFC 3986, section 5.2.4: a trailing "." or ".." leaves a
// trailing slash, "/api/x/.." is "/api/", and ".." never climbs above the
// root). A trailing slash is kept.
func normalizePath(p string) string {
	if p == "" || p[0] != '/' && p[0] != '\\' {
		p = "/" + p
	}
	if !needsNormalizing(p) {
		return p
	}
	p = strings.ReplaceAll(p, `\`, "/")
	segs := make([]string, 0, strings.Count(p, "/"))
	trailing := false
	for seg := range strings.SplitSeq(p[1:], "/") {
		trailing = false
		switch seg {
		case "":
			trailing = true
		case ".":
			trailing = true
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			trailing = true
		default:
			segs = append(segs, seg)
		}
	}
	if len(segs) == 0 {
		return "/"
	}
	out := "/" + strings.Join(segs, "/")
	if trailing {
		out += "/"
	}
	return out
}

// needsNormalizing reports whether normalizePath would change p, which
// starts with '/'.
func needsNormalizing(p string) bool {
	if strings.Contains(p, `\`) || strings.Contains(p, "//") {
		return true
	}
	for seg := range strings.SplitSeq(p[1:], "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// foldCase maps s so that two strings that a case-insensitive router could
// take for the same compare equal: each letter becomes the smallest rune
// among its Unicode simple case folds and its upper- and lower-case
// mappings ('k', 'K' and the Kelvin sign are all 'K'; 'ı', 'i' and 'I' are
// 'I', as .NET's OrdinalIgnoreCase upper-cases them).
func foldCase(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToUpper(s)
	}
	return strings.Map(foldRune, s)
}

func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			return r - ('a' - 'A')
		}
		return r
	}
	m := r
	for _, c := range [...]rune{r, unicode.ToUpper(r), unicode.ToLower(r)} {
		for f := c; ; {
			m = min(m, f)
			if f = unicode.SimpleFold(f); f == c {
				break
			}
		}
	}
	return m
}

// Query parameters.

// queryParams calls yield with each name=value pair of a raw query, the
// name and value decoded (an undecodable one as it is), until yield returns
// false. Pairs are separated by '&' and by ';', which Rack 2 and older
// Python split at too: a client must not hide a second value from the
// sidecar behind a separator the application knows.
func queryParams(rawQuery string, yield func(name, value string) bool) {
	for rawQuery != "" {
		var pair string
		i := strings.IndexAny(rawQuery, "&;")
		if i < 0 {
			pair, rawQuery = rawQuery, ""
		} else {
			pair, rawQuery = rawQuery[:i], rawQuery[i+1:]
		}
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if !yield(unescapeQuery(k), unescapeQuery(v)) {
			return
		}
	}
}

func unescapeQuery(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	// Undecodable: the raw text still identifies the client.
	return s
}

// sameParamName reports whether an application could read the query
// parameter a as b: in any letter case (ASP.NET Core's query is
// case-insensitive), and as PHP names it (phpParamName).
func sameParamName(a, b string) bool {
	return a == b || strings.EqualFold(phpParamName(a), phpParamName(b))
}

// phpParamName is the name PHP registers a query parameter under
// (php_register_variable_ex): leading spaces dropped, ' ' and '.' read as
// '_' up to the first '[', which opens an array named by what comes before
// it when a ']' follows (key[0] is read as key), and is itself read as '_'
// when none does, the rest of the name then kept as it is. Laravel and
// Symfony read PHP's names.
func phpParamName(s string) string {
	if !strings.ContainsAny(s, ". [") {
		return s
	}
	s = strings.TrimLeft(s, " ")
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '.':
			b = append(b, '_')
		case '[':
			if strings.IndexByte(s[i+1:], ']') >= 0 {
				return string(b)
			}
			return string(append(append(b, '_'), s[i+1:]...))
		default:
			b = append(b, c)
		}
	}
	return string(b)
}
