package sidecar

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// maxForwardedHops bounds how far a forwarding chain is walked: no real
// deployment has this many trusted proxies in a row, and a forged header of
// thousands of entries must not cost more than this.
const maxForwardedHops = 32

// trustedProxies are the networks whose forwarding headers are believed.
type trustedProxies []netip.Prefix

// parseTrustedProxies parses a document's trustedProxies with the parser
// the manager renders them with, so both agree on every entry.
func parseTrustedProxies(cidrs []string) (trustedProxies, error) {
	t := make(trustedProxies, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := sidecarconfig.ParseTrustedProxy(c)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %w", c, err)
		}
		t = append(t, p)
	}
	return t, nil
}

func (t trustedProxies) contains(a netip.Addr) bool {
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedMode is the forwarding header a policy reads the client address
// from, behind a trusted proxy.
type forwardedMode uint8

const (
	// forwardedXFF: X-Forwarded-For only; the default, also for a document
	// without key.forwardedHeader (an older controller's, which read
	// Forwarded when there was no X-Forwarded-For: the client chose
	// between them by sending X-Forwarded-For itself when the proxy
	// wrote Forwarded).
	forwardedXFF forwardedMode = iota
	// forwardedRFC7239: Forwarded (RFC 7239) only.
	forwardedRFC7239
	numForwardedModes
)

// forwardedModeOf is the mode of a document's key.forwardedHeader.
func forwardedModeOf(header string) forwardedMode {
	switch header {
	case sidecarconfig.ForwardedRFC7239:
		return forwardedRFC7239
	}
	return forwardedXFF
}

// clientIP is the address of the request's client. The TCP peer is the
// client unless it is a trusted proxy; then the forwarding chain of the
// header mode names (the one the trusted proxy writes; the other header is
// the client's and is ignored) is walked from the right, over trusted
// proxies, to the right-most untrusted hop: each trusted proxy appended the
// address it saw, so that hop was written by a trusted proxy, and
// everything to its left may be forged by the client. When every hop is
// trusted the left-most one is the client. An unparsable hop ("unknown",
// an obfuscated identifier) stops the walk at the trusted proxy that wrote
// it; no header at all leaves the peer. ok is false only when the peer
// address itself is not an IP address (a test's RemoteAddr, a Unix socket).
func (t trustedProxies) clientIP(r *http.Request, mode forwardedMode) (addr netip.Addr, ok bool) {
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if len(t) == 0 || !t.contains(peer) {
		return peer, true
	}
	client := peer
	visit := func(hop string) bool {
		a, ok := parseHop(hop)
		if !ok {
			return false
		}
		client = a
		return t.contains(a)
	}
	if mode == forwardedRFC7239 {
		walkForwardedFromRight(r.Header["Forwarded"], visit)
	} else {
		walkListFromRight(r.Header["X-Forwarded-For"], visit)
	}
	return client, true
}

func parsePeer(remoteAddr string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return normalizeAddr(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(remoteAddr); err == nil {
		return normalizeAddr(a), true
	}
	return netip.Addr{}, false
}

func normalizeAddr(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// parseHop reads one forwarding hop: an IPv4 or IPv6 address, optionally
// with a port ("1.2.3.4:80", "[2001:db8::1]:80") or quoted (Forwarded).
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	if len(s) > 64 {
		return netip.Addr{}, false
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return normalizeAddr(a), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normalizeAddr(a), true
	}
	if host, _, ok := strings.Cut(s, ":"); ok && !strings.Contains(s[len(host)+1:], ":") {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// walkListFromRight calls visit for each comma-separated element of the
// header lines, right-most first, skipping empty elements, until visit
// returns false or maxForwardedHops elements were seen.
func walkListFromRight(lines []string, visit func(string) bool) {
	seen := 0
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			cut := strings.LastIndexByte(line, ',')
			elem := strings.TrimSpace(line[cut+1:])
			if elem != "" {
				if seen++; seen > maxForwardedHops || !visit(elem) {
					return
				}
			}
			if cut < 0 {
				break
			}
			line = line[:cut]
		}
	}
}

// walkForwardedFromRight is walkListFromRight for the RFC 7239 Forwarded
// header: each element's for= parameter, right-most element first. Commas
// inside quoted strings do not split elements. An element without for= is an
// unparsable hop.
func walkForwardedFromRight(lines []string, visit func(string) bool) {
	var elems []string
	for _, line := range lines {
		elems = append(elems, splitOutsideQuotes(line, ',')...)
		if len(elems) > 4*maxForwardedHops {
			// Only the right-most elements can matter.
			elems = append(elems[:0], elems[len(elems)-maxForwardedHops:]...)
		}
	}
	seen := 0
	for i := len(elems) - 1; i >= 0; i-- {
		if strings.TrimSpace(elems[i]) == "" {
			continue
		}
		if seen++; seen > maxForwardedHops || !visit(forwardedFor(elems[i])) {
			return
		}
	}
}

// forwardedFor returns the for= value of one Forwarded element ("" if none).
func forwardedFor(elem string) string {
	for _, pair := range splitOutsideQuotes(elem, ';') {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	inQuote, escaped, start := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case inQuote && c == '\\':
			escaped = true
		case c == '"':
			inQuote = !inQuote
		case c == sep && !inQuote:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
