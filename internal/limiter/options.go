package limiter

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// Options tune a Limiter. The zero value of every field means its default.
type Options struct {
	// Prefix starts every key (default "slidegate:"). It must not contain
	// braces: they would become the Redis Cluster hash tag of every key.
	Prefix string

	// Functions makes the limiter call the slidegate library's functions
	// (FCALL, FCALL_RO; library.go) instead of sending its scripts
	// (EVALSHA, EVAL after NOSCRIPT). The library must be loaded
	// (EnsureLibrary, which the manager does); the identity needs +fcall
	// and +fcall_ro, and no EVAL (FunctionACLRules). Both run the same Lua
	// on the same keys, so limiters of either kind share counts exactly.
	// false is the form of a Redis identity shared by every namespace
	// (ACLRules), and of the first release.
	Functions bool

	// CallPerDecision sends each decision as a call of its own (the decide
	// script or function), as releases before the batch call did, instead
	// of one call deciding every decision of a round trip that shares a
	// slot (slidegate_decide_batch_v1). For benchmarks beside the earlier
	// form, and for a Redis whose slidegate library predates the batch
	// function (revision 1).
	CallPerDecision bool

	// Timeout bounds each Decide call that goes to Redis (default 1s).
	// When it passes, the decision is made by the rule's fail mode. It is
	// how long a Redis that stopped answering without an error (a hang, a
	// lost network) can hold a request before the breaker opens; it is not
	// a latency target: a merely slow Redis must still decide, since a
	// fallback decision cannot see what Redis admitted.
	Timeout time.Duration
	// MaxTimeout bounds how far the decision budget stretches past Timeout
	// while Redis's answers are slow: a decision waits twice the slowest
	// answer of the last one to two seconds, if that is longer than
	// Timeout, up to MaxTimeout (default 3×Timeout). The open breaker's
	// probe waits up to MaxTimeout too, connection setup included, and its
	// answer's time counts: a Redis that is slower than Timeout but answers
	// within MaxTimeout decides again, one that does not is treated as down.
	MaxTimeout time.Duration

	// ExpiryMargin is added to the window in each key's PEXPIRE (default
	// 1s): a key outlives its newest admit by window+margin, so a failover
	// to a replica whose clock runs a little ahead drops nothing still
	// counted.
	ExpiryMargin time.Duration

	// Replicas returns how many sidecars share the limit, for the fail-open
	// share ceil(limit/replicas). nil or a result below 1 means 1.
	Replicas func() int

	// MaxBatch bounds how many decisions one pipelined round trip carries
	// (default 256).
	MaxBatch int
	// MaxInflight bounds the pipelined round trips in flight at once, i.e.
	// the connections the limiter uses for decisions (default 2). A batch is
	// sent as soon as one of them is free.
	MaxInflight int
	// MaxWait is how long a free connection waits for more decisions when
	// the batch it found is smaller than MaxBatch (default 0: send at once).
	// A small value (tens of µs) trades latency for fewer round trips.
	MaxWait time.Duration
	// QueueSize bounds the decisions waiting for a connection (default
	// 16×MaxBatch); beyond it Decide waits, still within Timeout.
	QueueSize int

	// ReplicaWait bounds how long a round trip that carries a durable
	// rule's admit (Rule.Durable) waits for a replica to acknowledge it
	// (WAIT's timeout; default 100ms, and never more than half of what
	// remains of the round trip's deadline). A replica on a healthy
	// network acknowledges within a round trip between master and replica;
	// past ReplicaWait the admit goes to the rule's fail mode, so a master
	// without a replica costs such round trips this much each.
	ReplicaWait time.Duration

	// BreakerFailures is the number of consecutive failed round trips or
	// timed-out decisions that opens the circuit breaker (default 5).
	BreakerFailures int
	// ProbeInterval is how often an open breaker PINGs Redis (every master
	// on a cluster) to close again (default 200ms).
	ProbeInterval time.Duration

	// FallbackMaxClients bounds the (rule, client) pairs the fail-open
	// fallback tracks (default 10000). Beyond it, a new client shares one
	// budget per rule with every other untracked client, so no client is
	// ever forgotten while it still has admits in its window.
	FallbackMaxClients int
	// FallbackMaxLogBytes bounds the memory of the fail-open fallback's
	// sliding logs together (default 16 MiB, 2 million admits at 8 bytes;
	// negative: unbounded). A client whose log would grow past it is
	// counted by a sliding-window counter instead, which keeps the admits
	// it counted (docs/operations.md, "Fail-open memory").
	FallbackMaxLogBytes int64
	// DenyCacheMax bounds the keys whose last Redis answer the limiter
	// remembers (default 10000; negative: none). While Redis says a key is
	// exhausted until T, its requests are denied locally until T with the
	// same headers (the deny cache); while Redis cannot answer, the
	// fail-open fallback starts each remembered key from what Redis said.
	DenyCacheMax int
	// DenyCacheHold bounds how long the deny cache serves one denial
	// without asking Redis again (default 10 s), however far its
	// RetryAfter: budget returned early, by a reset of the client on
	// another replica or an undo, reaches this process within it.
	DenyCacheHold time.Duration
}

const (
	defaultPrefix      = redisschema.DefaultPrefix
	defaultTimeout     = time.Second
	defaultMargin      = time.Second
	defaultMaxBatch    = 256
	defaultMaxInflight = 2
	defaultBreaker     = 5
	defaultReplicaWait = 100 * time.Millisecond
	defaultProbe       = 200 * time.Millisecond
	defaultFallbackMax = 10000
	// defaultFallbackLogBytes: with 10,000 entries of fallbackEntryBytes,
	// the fallback's worst case stays near 21 MiB, well inside the injected
	// sidecar's 128 MiB memory limit (docs/operations.md).
	defaultFallbackLogBytes = 16 << 20
	defaultDenyCache        = 10000
	defaultDenyCacheHold    = 10 * time.Second
	maxPrefixLen            = 64
	maxWindow               = 365 * 24 * time.Hour
	minWindow               = time.Millisecond
	failedClosedRetry       = time.Second // RetryAfter of a failed-closed decision: a guess at when Redis is back
)

func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return o, fmt.Errorf("limiter: prefix %q must not contain braces", o.Prefix)
	}
	if len(o.Prefix) > maxPrefixLen {
		return o, fmt.Errorf("limiter: prefix longer than %d bytes", maxPrefixLen)
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = 3 * o.Timeout
	}
	if o.MaxTimeout < o.Timeout {
		return o, errors.New("limiter: MaxTimeout below Timeout")
	}
	if o.ExpiryMargin <= 0 {
		o.ExpiryMargin = defaultMargin
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = defaultMaxInflight
	}
	if o.MaxWait < 0 {
		return o, errors.New("limiter: negative MaxWait")
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 16 * o.MaxBatch
	}
	if o.ReplicaWait <= 0 {
		o.ReplicaWait = defaultReplicaWait
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = defaultBreaker
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = defaultProbe
	}
	if o.FallbackMaxClients <= 0 {
		o.FallbackMaxClients = defaultFallbackMax
	}
	if o.FallbackMaxLogBytes == 0 {
		o.FallbackMaxLogBytes = defaultFallbackLogBytes
	}
	if o.DenyCacheMax == 0 {
		o.DenyCacheMax = defaultDenyCache
	}
	if o.DenyCacheHold <= 0 {
		o.DenyCacheHold = defaultDenyCacheHold
	}
	return o, nil
}

func (o Options) replicas() int64 {
	if o.Replicas == nil {
		return 1
	}
	if n := o.Replicas(); n > 1 {
		return int64(n)
	}
	return 1
}
