package sidecar

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

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
// request facts that client keys are made of.
type reqInfo struct {
	r       *http.Request
	trusted trustedProxies

	ip        string
	path      string
	claims    map[string]json.RawMessage
	ipDone    bool
	pathDone  bool
	claimDone bool
}

// cleanPath is the request's path as cleanRequestPath makes it, computed
// once.
func (ri *reqInfo) cleanPath() string {
	if !ri.pathDone {
		ri.path, ri.pathDone = cleanRequestPath(ri.r.URL.Path), true
	}
	return ri.path
}

// remoteKey is the client key of the request's client address.
func (ri *reqInfo) remoteKey() string {
	if !ri.ipDone {
		ri.ipDone = true
		if a, ok := ri.trusted.clientIP(ri.r); ok {
			ri.ip = keyPrefixIP + a.String()
		} else {
			ri.ip = keyUnknownPeer
		}
	}
	return ri.ip
}

// key is the client key of the request for policy p. ok is false when the
// request has no value for the policy's source and the policy's OnMissing is
// Deny or Allow (the caller applies it); OnMissing RemoteAddress falls back
// here. Header, query and claim values are hashed: they may be credentials,
// and a hash is bounded and safe in a Redis key.
func (ri *reqInfo) key(p *policy) (key string, ok bool) {
	var v string
	switch p.source {
	case sidecarconfig.SourceGlobal:
		return keyGlobal, true
	case sidecarconfig.SourceRemoteAddress:
		return ri.remoteKey(), true
	case sidecarconfig.SourceHeader:
		if vs := ri.r.Header[p.keyName]; len(vs) > 0 {
			v = strings.TrimSpace(vs[0])
		}
		if v != "" {
			return hashKey(keyPrefixHeader, v), true
		}
	case sidecarconfig.SourceQueryParameter:
		if v = queryValue(ri.r.URL.RawQuery, p.keyName); v != "" {
			return hashKey(keyPrefixQuery, v), true
		}
	case sidecarconfig.SourceJWTClaim:
		if v = ri.claim(p.keyName); v != "" {
			return hashKey(keyPrefixClaim, v), true
		}
	}
	if p.onMissing == sidecarconfig.MissingRemoteAddress {
		return ri.remoteKey(), true
	}
	return "", false
}

// hashKey hashes the whole value: cutting it first would make clients whose
// values share the cut prefix share one budget. The hash alone bounds the key
// (and so Redis memory); the value's own length is bounded by the server's
// MaxHeaderBytes, which the query and the bearer token count against too.
func hashKey(prefix, v string) string {
	sum := sha256.Sum256([]byte(v))
	return prefix + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// queryValue returns the first value of the query parameter name in a raw
// query, decoded ("" when absent or empty). It does not parse the rest of
// the query.
func queryValue(rawQuery, name string) string {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		if uv, err := url.QueryUnescape(v); err == nil {
			return uv
		}
		// Undecodable: the raw text still identifies the client.
		return v
	}
	return ""
}

// claim returns a top-level claim of the request's bearer token, read from
// the token's payload WITHOUT verifying its signature: the policy's key
// documents that a component in front of the sidecar verified the token.
// Strings are used as they are, numbers and booleans as their JSON text;
// anything else (objects, arrays, null) is missing.
func (ri *reqInfo) claim(name string) string {
	if !ri.claimDone {
		ri.claimDone = true
		ri.claims = bearerClaims(ri.r.Header["Authorization"])
	}
	raw, ok := ri.claims[name]
	if !ok || len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		return s
	case 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw)
	}
	return ""
}

// bearerClaims decodes the payload of the first Authorization: Bearer token
// (nil when there is none or it is not a JWS compact token with a JSON
// object payload).
func bearerClaims(auth []string) map[string]json.RawMessage {
	if len(auth) == 0 {
		return nil
	}
	h := strings.TrimSpace(auth[0])
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return nil
	}
	tok := strings.TrimSpace(h[len(scheme):])
	if len(tok) > maxBearerBytes {
		return nil
	}
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
