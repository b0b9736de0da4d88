/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package redisadmin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// Usage is what MemoryUsage found.
type Usage struct {
	// Bytes is, by user name, the memory its keys hold, summed over the
	// masters that answered.
	Bytes map[string]int64
	// Keys is, by user name, how many keys it holds.
	Keys map[string]int64
	// Scanned is how many keys under slidegate's prefix were measured.
	Scanned int64
}

// scanCount is SCAN's COUNT: keys measured per round trip.
const scanCount = 512

// MemoryUsage measures, on every master, the memory the keys of each of
// users hold: it walks slidegate's keys with SCAN and asks MEMORY USAGE
// of each, with SAMPLES 0 (every element counted: a tenant cannot hide
// large members behind small ones that a sample would see first; it costs
// Redis about 18 ns per element, 18 ms for a key of a million). A key is a
// user's when one of the user's ACL key patterns (Rules "~...") matches
// it: the keys the user can write, and only those.
//
// A master that fails leaves its keys uncounted and its error in the
// result: the figures are then a lower bound (enough to find a user over
// a budget, never to clear one).
func (a *Admin) MemoryUsage(ctx context.Context, users []User) (Usage, error) {
	owners := newKeyOwners(users)
	a.mu.Lock()
	nodes, err := a.discover(ctx)
	clients := make([]*redis.Client, 0, len(nodes))
	for _, n := range nodes {
		clients = append(clients, n.client)
	}
	a.mu.Unlock()
	u := Usage{Bytes: map[string]int64{}, Keys: map[string]int64{}}
	if err != nil {
		return u, err
	}
	var errs []error
	for _, c := range clients {
		// One node at a time: the measure is a background chore, and Redis
		// serves decisions between its round trips.
		master, _, err := identify(ctx, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Options().Addr, err))
			continue
		}
		if !master {
			continue
		}
		if err := owners.measure(ctx, c, &u); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Options().Addr, err))
		}
	}
	return u, errors.Join(errs...)
}

// measure adds what the keys on c hold to u.
func (o *keyOwners) measure(ctx context.Context, c *redis.Client, u *Usage) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, redisschema.KeysPattern(""), scanCount).Result()
		if err != nil {
			return fmt.Errorf("SCAN: %w", err)
		}
		if len(keys) > 0 {
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.MemoryUsage(ctx, k, 0)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("MEMORY USAGE: %w", err)
			}
			for i, cmd := range cmds {
				n, err := cmd.(*redis.IntCmd).Result()
				if err != nil {
					continue // expired since SCAN saw it
				}
				u.Scanned++
				if owner := o.owner(keys[i]); owner != "" {
					u.Bytes[owner] += n
					u.Keys[owner]++
				}
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// keyOwners finds the user whose key patterns match a key. The patterns
// the manager gives its users (redisschema.KeyPatterns) are literals or a
// literal followed by "*", so matching is a prefix (or an exact) lookup.
// Namespace names hold no "/", so no user's prefix starts another's: the
// only prefix that can match a key is the greatest one not after it.
type keyOwners struct {
	prefixes []string // sorted
	byPrefix map[string]string
	exact    map[string]string
}

func newKeyOwners(users []User) *keyOwners {
	o := &keyOwners{byPrefix: map[string]string{}, exact: map[string]string{}}
	for _, u := range users {
		for _, r := range u.Rules {
			pattern, ok := strings.CutPrefix(r, "~")
			if !ok {
				continue
			}
			lit, prefix, ok := literalPattern(pattern)
			switch {
			case !ok:
				// Not a pattern the manager writes: nothing is attributed
				// to it.
			case prefix:
				o.byPrefix[lit] = u.Name
				o.prefixes = append(o.prefixes, lit)
			default:
				o.exact[lit] = u.Name
			}
		}
	}
	slices.Sort(o.prefixes)
	o.prefixes = slices.Compact(o.prefixes)
	return o
}

// owner is the user key belongs to, or "".
func (o *keyOwners) owner(key string) string {
	if name, ok := o.exact[key]; ok {
		return name
	}
	i := sort.SearchStrings(o.prefixes, key)
	if i < len(o.prefixes) && o.prefixes[i] == key {
		return o.byPrefix[key]
	}
	if i > 0 && strings.HasPrefix(key, o.prefixes[i-1]) {
		return o.byPrefix[o.prefixes[i-1]]
	}
	return ""
}

// literalPattern reads a Redis glob that is a literal (escapes allowed),
// optionally followed by one "*": the literal and whether the "*" ends it.
// Any other glob is not ok.
func literalPattern(p string) (lit string, prefix, ok bool) {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '\\':
			if i+1 == len(p) {
				return "", false, false
			}
			i++
			b.WriteByte(p[i])
		case '*':
			if i != len(p)-1 {
				return "", false, false
			}
			return b.String(), true, true
		case '?', '[', ']':
			return "", false, false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), false, true
}
