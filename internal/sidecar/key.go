package sidecar

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

const (
	// maxBearerBytes bounds the bearer token whose payload is decoded; a
	// longer token has no claims (OnMissing applies).
	maxBearerBytes = 16 << 10

	// Client key prefixes: one namespace per source, so that a header value
	// can never collide with an address in a policy that falls back to the
	// remote address.
	keyPrefixIP     = "ip:"
	keyPrefixHeader = "h:"
	keyPrefixQuery  = "q:"
	keyPrefixClaim  = "jwt:"
	keyGlobal       = "global"
	// keyUnknownPeer is the remote-address key of a peer that is not an IP
	// address (only possible outside a TCP listener).
	keyUnknownPeer = keyPrefixIP + "unknown"
)

// reqInfo computes, once per request and only when a policy needs them, the
// request facts that policies match and key on.
type reqInfo struct {
	r       *http.Request
	trusted trustedProxies

	// clients is the client address by the forwarding header read
	// (forwardedXFF, forwardedRFC7239).
	clients [numForwardedModes]struct {
		addr     netip.Addr
		ok, done bool
	}
	forms, folded         []string
	formsDone, foldedDone bool

	// bearer is the request's bearer token (bearerState keyFound), its
	// payload read unverified, and what each policy's verifier made of it.
	bearer                  string
	bearerState             keyState
	bearerDone, payloadDone bool
	payload                 map[string]json.RawMessage
	verifiedBy              []verifiedToken
	now                     time.Time
	// trustClaims reads claims without verification for every policy:
	// only for /debug/why, whose operator gives a claim value as that of
	// a token the sidecar verified. Never set on the request path.
	trustClaims bool
}

// keyState says what a request gives for a policy's client key.
type keyState uint8

const (
	// keyFound: one value, the client key.
	keyFound keyState = iota
	// keyMissing: no value; the policy's onMissing applies.
	keyMissing
	// keyAmbiguous: more than one value, or one that the application may
	// read as another name's: the request is refused (400) whatever
	// onMissing says, so that a client cannot pick its bucket by adding a
	// value in front of the one a gateway appends (Envoy's default append
	// action), nor escape one by sending nothing but a second spelling.
	keyAmbiguous
)

// remoteKey is the client key of the request's client address for policy
// p: the address, or for an IPv6 address the network of p's prefix length
// around it.
func (ri *reqInfo) remoteKey(p *policy) string {
	c := &ri.clients[p.forwarded]
	if !c.done {
		c.done = true
		c.addr, c.ok = ri.trusted.clientIP(ri.r, p.forwarded)
	}
	if !c.ok {
		return keyUnknownPeer
	}
	return addressKey(c.addr, p.ipv6Bits)
}

// addressKey is the client key of address a, an IPv6 one counted by its
// network of the given prefix length (128: the address itself). An
// address of the NAT64 well-known prefix 64:ff9b::/96 (RFC 6052) counts as
// the IPv4 address it carries: its /64 would put every IPv4 client of the
// translator in one bucket.
func addressKey(a netip.Addr, ipv6Bits int) string {
	if !a.Is6() || ipv6Bits >= 128 {
		return keyPrefixIP + a.String()
	}
	if nat64WellKnown.Contains(a) {
		b := a.As16()
		return keyPrefixIP + netip.AddrFrom4([4]byte(b[12:])).String()
	}
	pfx, _ := a.Prefix(ipv6Bits) // bits are checked by the config
	return keyPrefixIP + pfx.String()
}

var nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")

// key is the client key of the request for policy p, with keyFound, or
// what the request gives instead (keyMissing when p's onMissing is Deny or
// Allow: the caller applies it; keyAmbiguous). OnMissing RemoteAddress
// falls back here. Header, query and claim values are hashed: they may be
// credentials, and a hash is bounded and safe in a Redis key.
func (ri *reqInfo) key(p *policy) (string, keyState) {
	var v string
	st := keyMissing
	switch p.source {
	case sidecarconfig.SourceGlobal:
		return keyGlobal, keyFound
	case sidecarconfig.SourceRemoteAddress:
		return ri.remoteKey(p), keyFound
	case sidecarconfig.SourceHeader:
		if v, st = headerIdentity(ri.r.Header, p.keyName); st == keyFound {
			return hashKey(keyPrefixHeader, v), keyFound
		}
	case sidecarconfig.SourceQueryParameter:
		if v, st = queryIdentity(ri.r.URL.RawQuery, p.keyName); st == keyFound {
			return hashKey(keyPrefixQuery, v), keyFound
		}
	case sidecarconfig.SourceJWTClaim:
		if v, st = ri.claim(p); st == keyFound {
			return hashKey(keyPrefixClaim, v), keyFound
		}
	}
	if st == keyMissing && p.onMissing == sidecarconfig.MissingRemoteAddress {
		return ri.remoteKey(p), keyFound
	}
	return "", st
}

// headerIdentity is the value of the header canon (canonical form) that
// identifies a client: its one line, trimmed. Several lines, a line with a
// comma (RFC 9110 lets any hop join repeated lines into one with commas,
// and Envoy does for some headers), or a line whose name differs from
// canon only by '_' for '-' (CGI-style servers, PHP-FPM and WSGI among
// them, read both as the same variable) make it ambiguous. An empty value
// is missing.
func headerIdentity(h http.Header, canon string) (string, keyState) {
	vs := h[canon]
	n := len(vs)
	for k, other := range h {
		if len(k) == len(canon) && k != canon && strings.IndexByte(k, '_') >= 0 &&
			strings.EqualFold(strings.ReplaceAll(k, "_", "-"), canon) {
			n += len(other)
		}
	}
	switch {
	case n == 0:
		return "", keyMissing
	case n > 1 || len(vs) != 1 || strings.IndexByte(vs[0], ',') >= 0 || connectionNames(h, canon):
		return "", keyAmbiguous
	}
	if v := strings.TrimSpace(vs[0]); v != "" {
		return v, keyFound
	}
	return "", keyMissing
}

// connectionNames reports whether h's Connection header lists the header
// name: a hop-by-hop header (RFC 9110, 7.6.1), which the reverse proxy
// removes before the application sees the request. A value read from it is
// one the application never saw: keyed on it, a client would pick its own
// bucket while the application serves it as a client without one (past a
// policy's onMissing Deny). HTTP/2 has no Connection header.
func connectionNames(h http.Header, name string) bool {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), name) {
				return true
			}
		}
	}
	return false
}

// queryIdentity is the value of the query parameter name that identifies a
// client, decoded (undecodable: as it is). The parameter given twice, even
// empty once (PHP and Rails read the last value, Flask the first), or given
// once under a name that only some applications read as name (another
// letter case, '.' or ' ' for '_') makes it ambiguous. An empty value is
// missing.
func queryIdentity(rawQuery, name string) (string, keyState) {
	var v string
	n, exact := 0, false
	queryParams(rawQuery, func(k, val string) bool {
		if sameParamName(k, name) {
			n++
			v, exact = val, k == name
		}
		return n < 2
	})
	switch {
	case n == 0:
		return "", keyMissing
	case n > 1 || !exact:
		return "", keyAmbiguous
	case v == "":
		return "", keyMissing
	}
	return v, keyFound
}

// hashKey hashes the whole value: cutting it first would make clients whose
// values share the cut prefix share one budget. The hash alone bounds the key
// (and so Redis memory); the value's own length is bounded by the server's
// MaxHeaderBytes, which the query and the bearer token count against too.
func hashKey(prefix, v string) string {
	sum := sha256.Sum256([]byte(v))
	return prefix + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// claim returns the top-level claim name of the request's bearer token for
// policy p. For a policy that verifies tokens (p.jwt), only a token whose
// signature, issuer, audience and validity check out has claims: any
// other is missing, so that onMissing decides (issue 23: an unverified
// token let a client mint a new subject, and a new budget, per request).
// A policy without verification reads the payload unverified, as its
// key documents (a gateway in front verified the token). Strings are
// used as they are, numbers and booleans as their JSON text; anything
// else (objects, arrays, null) is missing.
func (ri *reqInfo) claim(p *policy) (string, keyState) {
	if !ri.bearerDone {
		ri.bearerDone = true
		ri.bearer, ri.bearerState = bearerToken(ri.r.Header["Authorization"])
		if ri.bearerState == keyFound && connectionNames(ri.r.Header, "Authorization") {
			ri.bearerState = keyAmbiguous
		}
	}
	if ri.bearerState != keyFound {
		return "", ri.bearerState
	}
	var claims map[string]json.RawMessage
	if p.jwt == nil || ri.trustClaims {
		if !ri.payloadDone {
			ri.payloadDone = true
			ri.payload = payloadClaims(ri.bearer)
		}
		claims = ri.payload
	} else {
		claims = ri.verified(p)
	}
	return claimValue(claims, p.keyName)
}

// verified is the claims of the request's bearer token as p's verifier
// sees them (nil: it does not verify), verified once per verifier and
// request, and counted in p's token metrics.
func (ri *reqInfo) verified(p *policy) map[string]json.RawMessage {
	for i := range ri.verifiedBy {
		if ri.verifiedBy[i].v == p.jwt {
			return ri.verifiedBy[i].claims
		}
	}
	if ri.now.IsZero() {
		ri.now = time.Now()
	}
	claims, failure := p.jwt.Verify(ri.bearer, ri.now)
	if failure != "" {
		claims = nil
	}
	if p.tokens != nil {
		p.tokens[failure].Inc()
	}
	ri.verifiedBy = append(ri.verifiedBy, verifiedToken{p.jwt, claims})
	return claims
}

// verifiedToken is the result of one verifier on the request's token.
type verifiedToken struct {
	v      *jwtverify.Verifier
	claims map[string]json.RawMessage
}

// claimValue is claim name of claims as a client key.
func claimValue(claims map[string]json.RawMessage, name string) (string, keyState) {
	raw, ok := claims[name]
	if !ok || len(raw) == 0 {
		return "", keyMissing
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil || s == "" {
			return "", keyMissing
		}
		return s, keyFound
	case 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), keyFound
	}
	return "", keyMissing
}

// bearerToken is the request's Authorization: Bearer token: keyMissing
// when there is none (or it is longer than maxBearerBytes), keyAmbiguous
// when the request has more than one Authorization line or its bearer
// credential has a comma (two tokens joined into one line, as Envoy joins
// an appended Authorization), since which token the application reads is
// then its choice, not the sidecar's.
func bearerToken(auth []string) (string, keyState) {
	if len(auth) == 0 {
		return "", keyMissing
	}
	if len(auth) > 1 {
		return "", keyAmbiguous
	}
	h := strings.TrimSpace(auth[0])
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", keyMissing
	}
	tok := strings.TrimSpace(h[len(scheme):])
	if strings.IndexByte(tok, ',') >= 0 {
		return "", keyAmbiguous
	}
	if len(tok) > maxBearerBytes {
		return "", keyMissing
	}
	return tok, keyFound
}

// payloadClaims decodes the payload of a JWS compact token WITHOUT
// verifying it: nil when it is not one with a JSON object payload.
func payloadClaims(tok string) map[string]json.RawMessage {
	_, rest, ok := strings.Cut(tok, ".")
	if !ok {
		return nil
	}
	payload, _, ok := strings.Cut(rest, ".")
	if !ok {
		return nil
	}
	data, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(payload, "="))
	if err != nil {
		return nil
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil
	}
	var claims map[string]json.RawMessage
	if json.Unmarshal(data, &claims) != nil {
		return nil
	}
	return claims
}
