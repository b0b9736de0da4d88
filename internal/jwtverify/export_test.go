package jwtverify

// Test hooks.

// CachedTokens is the number of verified tokens v remembers.
func CachedTokens(v *Verifier) int { return v.cached() }

// SetCacheSize gives v an empty cache of size tokens.
func SetCacheSize(v *Verifier, size int) { v.cache = newTokenCache(size) }

// DisableCache makes v verify every token in full.
func DisableCache(v *Verifier) { v.cache = nil }
