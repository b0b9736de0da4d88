package redisschema

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DefaultPrefix is the prefix of every key when none is configured.
const DefaultPrefix = "slidegate:"

// Bounds of the parts of a key after escaping. Longer parts are replaced by
// a hash so that a client value chosen by a caller (a header, a path) cannot
// make keys, and so Redis memory, arbitrarily large.
const (
	maxRulePart   = 128
	maxClientPart = 64
	// hashedMark starts a hashed part. escape never emits it, so a hashed
	// value can never equal an escaped one.
	hashedMark = '~'
)

// Key returns the Redis key of one client under one rule:
//
//	<prefix>{<rule id>:<client>}
//
// The braces are the Redis Cluster hash tag, so every key of a (rule,
// client) pair lives in one slot. Request data never supplies braces: they,
// and bytes outside a small safe set, are percent-escaped ('%XX'), in the
// rule id ':' too, so distinct (rule, client) pairs give distinct keys. A
// part longer than its bound after escaping is replaced by '~' and 32 hex
// digits of its SHA-256. Key is deterministic and allocates once in the
// common case.
func Key(prefix, ruleID, client string) string {
	p := escapePrefix(prefix)
	r := boundPart(ruleID, maxRulePart, true)
	c := boundPart(client, maxClientPart, false)
	var b strings.Builder
	b.Grow(len(p) + len(r) + len(c) + 3)
	b.WriteString(p)
	b.WriteByte('{')
	b.WriteString(r)
	b.WriteByte(':')
	b.WriteString(c)
	b.WriteByte('}')
	return b.String()
}

// VariantKey is the key of one of several windows of a rule for one client
// (limiter.Rule.Variant): key, a Key or CounterKey, with "@" and variant
// after it. Outside the hash tag, so every window of a (rule, client) pair
// is in its slot; after the '}' (or the 'c' after it) of a key that request
// data never writes past, so no other rule's or client's key is the same.
func VariantKey(key, variant string) string {
	return key + "@" + variant
}

// CounterKey is the key of the SlidingWindowCounter hash: a different key
// than the log's, so that switching a rule's algorithm never meets a key of
// the wrong type (WRONGTYPE), in the same slot.
func CounterKey(prefix, ruleID, client string) string {
	return Key(prefix, ruleID, client) + "c"
}

// WeightedKey is the key of a weighted rule (limiter.Rule.Weighted): its
// own key, so that a rule switched between counting requests and counting
// cost never reads the other's counts, in the same slot. A weighted
// SlidingLog key has two companions the scripts derive from it, its sums
// (key+"s") and its checkpoints (key+"p"); a weighted counter is a
// counter hash (key "…wc").
func WeightedKey(prefix, ruleID, client string, counter bool) string {
	if counter {
		return Key(prefix, ruleID, client) + "wc"
	}
	return Key(prefix, ruleID, client) + "w"
}

func safeByte(c byte, colonSafe bool) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '-', c == '_', c == '.', c == '/', c == '@', c == '+', c == '=', c == ',', c == ';':
		return true
	case c == ':':
		// The first ':' inside the tag separates rule from client, so a rule
		// id must not contain one; a client may (IPv6 addresses stay readable).
		return colonSafe
	}
	return false
}

const hexDigits = "0123456789ABCDEF"

// boundPart escapes s and hashes it when the result is longer than max.
func boundPart(s string, limit int, isRule bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if safeByte(s[i], !isRule) {
			n++
		} else {
			n += 3
		}
		if n > limit {
			return hashed(s)
		}
	}
	if n == len(s) {
		return s
	}
	b := make([]byte, 0, n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safeByte(c, !isRule) {
			b = append(b, c)
		} else {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return string(b)
}

func hashed(s string) string {
	sum := sha256.Sum256([]byte(s))
	var b [33]byte
	b[0] = hashedMark
	hex.Encode(b[1:], sum[:16])
	return string(b[:])
}

// escapePrefix neutralises braces in the prefix: a '{' there would become
// the hash tag of every key and put them all in one slot.
func escapePrefix(p string) string {
	if !strings.ContainsAny(p, "{}") {
		return p
	}
	r := strings.NewReplacer("{", "%7B", "}", "%7D")
	return r.Replace(p)
}

// HashTag returns the part of key that Redis Cluster hashes: the bytes
// between the first '{' and the next '}', when that is not empty.
func HashTag(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// Slot is the Redis Cluster hash slot of key (CRC16/XMODEM of the hash tag,
// mod 16384), as the cluster itself computes it.
func Slot(key string) int {
	tag := HashTag(key)
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^tag[i]]
	}
	return int(crc) & 16383
}

var crc16tab = func() (t [256]uint16) {
	for i := range 256 {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
