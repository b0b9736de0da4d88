package redisschema

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The slidegate library: the limiter's scripts as Redis Functions
// (Redis 7+), loaded by the manager with an administrative identity
// (FUNCTION LOAD) and called by the sidecars and the rate limit service
// with FCALL (limiter.Options.Functions). A namespace's own Redis identity may
// call the functions and nothing of EVAL, SCRIPT or FUNCTION: it runs no
// code of its own. Functions replicate to the replicas and persist with
// RDB and AOF, so a failover or a restart with persistence keeps them; a
// Redis that lost them (a restart without persistence, a new empty
// replica promoted) answers "ERR Function not found" (limiter.ErrNoFunctions)
// until the manager loads them again, and meanwhile each rule's fail mode
// decides.
//
// Each function runs the same Lua as the EVAL script of the same name, on
// the same keys, members and hash fields, so sidecars of a release that
// calls EVALSHA and of one that calls FCALL can share one Redis while a
// fleet is upgraded, and the limits stay exact.
//
// Function names carry a version (slidegate_decide_v1). A change to a
// function's arguments, reply or meaning is a new name; a library keeps
// every version that the sidecars of the release before it call, so that
// one library serves both releases of a mixed fleet. The library's
// revision (LibraryRevision, in its source) only grows: a manager never
// replaces a library of a higher revision with its own (EnsureLibrary),
// so a manager rolled back does not take functions from the newer
// sidecars.

// LibraryName is the name of the library (`#!lua name=...`).
const LibraryName = "slidegate"

// LibraryRevision numbers the library's source; any change to the source
// raises it (TestLibraryRevision holds the source's hash for it).
const LibraryRevision = 7

// A Function is one function of the slidegate library. Its Lua is also
// the EVAL script of the same name (Script), for the sidecars that call
// EVALSHA.
type Function struct {
	// Name is the library's function: a versioned name.
	Name string
	// Body is the Lua; KEYS and ARGV are its parameters.
	Body string
	// NoWrites registers it with the no-writes flag (FCALL_RO; Redis
	// refuses any write it attempts).
	NoWrites bool
}

// Script is the function's EVAL form: its body, with the no-writes flag
// in a shebang when it has it.
func (f Function) Script() string {
	if f.NoWrites {
		return noWritesShebang + f.Body
	}
	return f.Body
}

// The functions of the library.
var (
	Decide      = Function{Name: "slidegate_decide_v1", Body: decideScript}
	DecideBatch = Function{Name: "slidegate_decide_batch_v1", Body: decideBatchScript}
	Undo        = Function{Name: "slidegate_undo_v1", Body: undoScript}
	Cancel      = Function{Name: "slidegate_cancel_v1", Body: cancelScript}
	Announce    = Function{Name: "slidegate_announce_v1", Body: announceScript}
	Peek        = Function{Name: "slidegate_peek_v1", Body: peekBody, NoWrites: true}
	Reset       = Function{Name: "slidegate_reset_v1", Body: resetScript}
)

// libraryFunctions are the functions of the library, in order.
var libraryFunctions = []Function{Decide, DecideBatch, Undo, Cancel, Announce, Peek, Reset}

// librarySource is the library's code, as FUNCTION LOAD takes it.
var librarySource = buildLibrary()

func buildLibrary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n-- slidegate library revision %d\n", LibraryName, LibraryRevision)
	for _, f := range libraryFunctions {
		// KEYS and ARGV are the parameters' names, so each body is the EVAL
		// script's text unchanged.
		fmt.Fprintf(&b, "\nredis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n%s\nend", f.Name, strings.TrimSpace(f.Body))
		if f.NoWrites {
			b.WriteString(", flags={'no-writes'}")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// LibrarySource returns the library's code, for a platform team that
// loads it itself (`redis-cli FUNCTION LOAD REPLACE "$(...)"`) and for the
// benchmarks.
func LibrarySource() string { return librarySource }

// LibraryState is what EnsureLibrary found on a server.
type LibraryState string

// The states of EnsureLibrary.
const (
	// LibraryCurrent: the server has this revision of the library.
	LibraryCurrent LibraryState = "current"
	// LibraryLoaded: it had no library, or an older (or other) one, and
	// now has this one.
	LibraryLoaded LibraryState = "loaded"
	// LibraryNewer: it has a higher revision (a newer manager loaded it),
	// which serves this release's functions too; it was left.
	LibraryNewer LibraryState = "newer"
)

var revisionLine = regexp.MustCompile(`(?m)^-- slidegate library revision (\d+)$`)

// EnsureLibrary makes the Redis server c (a master: a replica refuses
// FUNCTION LOAD and has its master's functions) hold the slidegate
// library: it loads it when the server has none, or an older or
// different one of the same revision, and leaves a higher revision. It
// needs an identity allowed FUNCTION LIST and FUNCTION LOAD.
func EnsureLibrary(ctx context.Context, c redis.Cmdable) (LibraryState, error) {
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: LibraryName, WithCode: true}).Result()
	if err != nil {
		return "", fmt.Errorf("FUNCTION LIST: %w", err)
	}
	for _, lib := range libs {
		if lib.Name != LibraryName {
			continue
		}
		if lib.Code == librarySource {
			return LibraryCurrent, nil
		}
		if m := revisionLine.FindStringSubmatch(lib.Code); m != nil {
			if rev, err := strconv.Atoi(m[1]); err == nil && rev > LibraryRevision {
				return LibraryNewer, nil
			}
		}
	}
	if err := c.FunctionLoadReplace(ctx, librarySource).Err(); err != nil {
		return "", fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	return LibraryLoaded, nil
}
