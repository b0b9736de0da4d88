// Package redisadmin administers the shared Redis for the manager, with
// the platform team's administrative identity (which never leaves the
// manager's namespace): it finds every node of the deployment, keeps the
// slidegate Functions library on every master and the ACL users of the
// namespaces' and the rate limit service's identities on every node, and
// tells whether a node accepts commands without AUTH.
//
// ACL users are per node and are not replicated: a user exists on a node
// only if it was set there, and is lost when the node restarts (unless an
// aclfile that holds it is loaded). So every node is set up — masters and
// replicas, since a replica may become a master — and set up again when
// it comes back with another run_id or joins the deployment. Functions
// are replicated and persisted: they are loaded on the masters only, and
// again wherever a master lacks them (a restart without persistence, an
// empty replica promoted).
//
// admin.go holds the users and their sync, topology.go how the nodes are
// found (a standalone server, a Cluster's nodes, a Sentinel's master and
// replicas), memory.go what each user's keys hold.
//
// Like redisconn and limiter, the package knows nothing of Kubernetes:
// the controller computes the users (their rules and passwords) and calls
// Apply and Sync.
package redisadmin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
)

// The names of the users the manager owns. Sync deletes any user of these
// names that it was not asked to keep, and touches no other.
const (
	// NamespaceUserPrefix starts the name of a namespace's user:
	// NamespaceUserPrefix + <namespace>.
	NamespaceUserPrefix = "slidegate-ns-"
	// RLSUser is the rate limit service's user.
	RLSUser = "slidegate-rls"
)

// NamespaceUser is the name of namespace's user.
func NamespaceUser(namespace string) string { return NamespaceUserPrefix + namespace }

// Managed reports whether name is the name of a user the manager owns.
func Managed(name string) bool {
	return strings.HasPrefix(name, NamespaceUserPrefix) || name == RLSUser
}

// User is an ACL user as the manager wants it on every node.
type User struct {
	Name string
	// Passwords are the valid passwords, each stored by Redis as its
	// SHA-256 (#<hex>: the cleartext is never sent to Redis): the current
	// one and, during a rotation, the previous one.
	Passwords []string
	// Rules follow "on" and the passwords in ACL SETUSER
	// (redisschema.FunctionACLRules).
	Rules []string
	// Off switches the user off: nobody can authenticate as it, and the
	// connections authenticated as it are closed when it is set (a
	// namespace over its memory budget, MemoryUsage). Its passwords and
	// rules stay, so switching it on again needs nothing else.
	Off bool
}

// setUser is the ACL SETUSER command that makes u exactly what it says:
// reset first, so a rule or password removed from u goes too.
func (u User) setUser() []any {
	state := "on"
	if u.Off {
		state = "off"
	}
	args := []any{"acl", "setuser", u.Name, "reset", state}
	for _, p := range u.Passwords {
		sum := sha256.Sum256([]byte(p))
		args = append(args, "#"+hex.EncodeToString(sum[:]))
	}
	for _, r := range u.Rules {
		args = append(args, r)
	}
	return args
}

// digest identifies what setUser sets, to skip a node that has it.
func (u User) digest() string {
	h := sha256.New()
	for _, a := range u.setUser() {
		fmt.Fprintf(h, "%v\x00", a)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Options configure an Admin.
type Options struct {
	// Redis is the deployment (mode, addresses, master name, TLS) and the
	// administrative identity (CredentialsDir, or Username and Password):
	// it needs ACL SETUSER, DELUSER and USERS, FUNCTION LOAD and LIST,
	// INFO, PING, and CLUSTER NODES (Cluster) or the sentinels' SENTINEL
	// (Sentinel).
	Redis redisconn.Config
	// Timeout bounds one node's work in a call (default 5s).
	Timeout time.Duration
}

// Admin administers one Redis deployment. It is safe for concurrent use;
// calls are serialised.
type Admin struct {
	o Options

	mu    sync.Mutex
	nodes map[string]*node // by address
}

// node is what the Admin knows of one Redis server.
type node struct {
	addr   string
	client *redis.Client
	// runID is the server's run_id when users were last set there: another
	// one means the server restarted and lost them.
	runID string
	// users are the digests of the users set there since runID.
	users map[string]string
}

// New is an Admin of the deployment o describes. It does not connect.
func New(o Options) (*Admin, error) {
	if o.Redis.Mode == "" {
		o.Redis.Mode = redisconn.Standalone
	}
	if err := o.Redis.Validate(); err != nil {
		return nil, err
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	return &Admin{o: o, nodes: map[string]*node{}}, nil
}

// Close closes the connections to the nodes.
func (a *Admin) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for addr, n := range a.nodes {
		_ = n.client.Close()
		delete(a.nodes, addr)
	}
}

// NodeStatus is what a call found on one node.
type NodeStatus struct {
	Addr   string
	Master bool
	// Restarted: the node has another run_id than when users were last
	// set there (or is new to the Admin): every user was set again.
	Restarted bool
	// Library is what EnsureLibrary found (masters; Sync only).
	Library redisschema.LibraryState
	// Unauthenticated: the node answered a command sent without AUTH
	// (Sync only).
	Unauthenticated bool
	// Err is why the node could not be set up; the other fields are then
	// partial.
	Err error
}

// Status is what a call found on every node.
type Status struct {
	Nodes []NodeStatus
}

// Err joins the nodes' errors.
func (s Status) Err() error {
	var errs []error
	for _, n := range s.Nodes {
		if n.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Addr, n.Err))
		}
	}
	return errors.Join(errs...)
}

// Unauthenticated lists the nodes that accepted a command without AUTH.
func (s Status) Unauthenticated() []string {
	var out []string
	for _, n := range s.Nodes {
		if n.Unauthenticated {
			out = append(out, n.Addr)
		}
	}
	return out
}

// Apply sets users on every node now, and deletes the managed users named
// in remove; users not named are left as they are. The controller calls
// it before it hands a namespace its credentials, so that they work from
// the first connection. An error names the nodes that failed; the others
// have the change.
func (a *Admin) Apply(ctx context.Context, users []User, remove []string) (Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	nodes, err := a.discover(ctx)
	if err != nil {
		return Status{}, err
	}
	st := a.each(ctx, nodes, func(ctx context.Context, n *node, ns *NodeStatus) error {
		if err := a.setUsers(ctx, n, users); err != nil {
			return err
		}
		return a.delUsers(ctx, n, remove)
	})
	return st, st.Err()
}

// Sync brings every node to the whole desired state: the library on every
// master; exactly users among the managed users on every node (the others
// deleted, which closes their connections); and it checks whether the node
// accepts a command without AUTH. The manager calls it periodically, with
// every user it wants.
func (a *Admin) Sync(ctx context.Context, users []User) (Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sync(ctx, users)
}

// syncDesired is Sync with the users desired returns, asked while no Apply
// runs: an Apply that set up a new namespace's user just before was
// decided from the same state (the controller's cache) that desired reads
// now, so this pass does not delete the user as stale; asked before taking
// the lock, the pass could delete it from an older state, and the
// namespace's sidecars were refused until the next pass.
func (a *Admin) syncDesired(ctx context.Context, desired func(context.Context) ([]User, error)) (Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	users, err := desired(ctx)
	if err != nil {
		return Status{}, err
	}
	return a.sync(ctx, users)
}

func (a *Admin) sync(ctx context.Context, users []User) (Status, error) {
	nodes, err := a.discover(ctx)
	if err != nil {
		return Status{}, err
	}
	keep := map[string]bool{}
	for _, u := range users {
		keep[u.Name] = true
	}
	st := a.each(ctx, nodes, func(ctx context.Context, n *node, ns *NodeStatus) error {
		ns.Unauthenticated = a.unauthenticated(ctx, n.addr)
		if ns.Master {
			state, err := redisschema.EnsureLibrary(ctx, n.client)
			if err != nil {
				return err
			}
			ns.Library = state
		}
		if err := a.setUsers(ctx, n, users); err != nil {
			return err
		}
		names, err := n.client.Do(ctx, "acl", "users").StringSlice()
		if err != nil {
			return fmt.Errorf("ACL USERS: %w", err)
		}
		var stale []string
		for _, name := range names {
			if Managed(name) && !keep[name] {
				stale = append(stale, name)
			}
		}
		return a.delUsers(ctx, n, stale)
	})
	return st, st.Err()
}

// each runs f on every node, in parallel, each bounded by the Timeout,
// after reading the node's role and run_id (a changed run_id forgets the
// users set there).
func (a *Admin) each(ctx context.Context, nodes []*node, f func(context.Context, *node, *NodeStatus) error) Status {
	st := Status{Nodes: make([]NodeStatus, len(nodes))}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
			defer cancel()
			ns := &st.Nodes[i]
			ns.Addr = n.addr
			master, runID, err := identify(ctx, n.client)
			if err != nil {
				ns.Err = err
				return
			}
			ns.Master = master
			if runID != n.runID {
				n.runID, n.users = runID, map[string]string{}
				ns.Restarted = true
			}
			ns.Err = f(ctx, n, ns)
		})
	}
	wg.Wait()
	slices.SortFunc(st.Nodes, func(x, y NodeStatus) int { return strings.Compare(x.Addr, y.Addr) })
	return st
}

// setUsers sets the users n does not have as they are (since its run_id).
func (a *Admin) setUsers(ctx context.Context, n *node, users []User) error {
	for _, u := range users {
		d := u.digest()
		if n.users[u.Name] == d {
			continue
		}
		if err := n.client.Do(ctx, u.setUser()...).Err(); err != nil {
			return fmt.Errorf("ACL SETUSER %s: %w", u.Name, err)
		}
		if u.Off {
			// A user switched off keeps the connections authenticated as
			// it (pooled by its sidecars): close them. Until this succeeds
			// the node is not marked done, so the next pass tries again.
			if err := n.client.Do(ctx, "client", "kill", "user", u.Name).Err(); err != nil {
				return fmt.Errorf("CLIENT KILL USER %s: %w", u.Name, err)
			}
		}
		n.users[u.Name] = d
	}
	return nil
}

// delUsers deletes the managed users of names from n: ACL DELUSER, which
// also closes the connections authenticated as them (a user switched off
// keeps them).
func (a *Admin) delUsers(ctx context.Context, n *node, names []string) error {
	var del []any
	for _, name := range names {
		if Managed(name) {
			del = append(del, name)
		}
	}
	if len(del) == 0 {
		return nil
	}
	if err := n.client.Do(ctx, append([]any{"acl", "deluser"}, del...)...).Err(); err != nil {
		return fmt.Errorf("ACL DELUSER: %w", err)
	}
	for _, name := range del {
		delete(n.users, name.(string))
	}
	return nil
}

// Run calls Sync with the users desired returns every interval, and once
// at the start, until ctx ends, handing each result to report. Between
// passes it asks each node every RestartWatch for its run_id (one INFO),
// and passes at once when a node restarted: users set with ACL SETUSER
// live in memory only (AOF and RDB do not keep them; only an ACL file
// saved with ACL SAVE would), so every restart takes the namespaces'
// users away, and without persistence the library too, and each rule's
// fail mode decides until they are back. A node that restarted, or a
// replica promoted empty, has its users and (a master) the library back
// within about RestartWatch, and any other drift within an interval.
func (a *Admin) Run(ctx context.Context, interval time.Duration, desired func(context.Context) ([]User, error), report func(Status, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	watch := time.NewTicker(min(RestartWatch, interval))
	defer watch.Stop()
	for {
		st, err := a.syncDesired(ctx, desired)
		if ctx.Err() != nil {
			return
		}
		report(st, err)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break wait
			case <-watch.C:
				if a.restarted(ctx) {
					t.Reset(interval)
					break wait
				}
			}
		}
	}
}

// RestartWatch is how often Run asks the nodes whether they restarted.
const RestartWatch = time.Second

// restarted reports whether a node that had its users set answers with
// another run_id: it restarted (or another server took its address) and
// has lost them. A node that does not answer is left to the next pass.
func (a *Admin) restarted(ctx context.Context) bool {
	a.mu.Lock()
	type known struct {
		c     *redis.Client
		runID string
	}
	nodes := make([]known, 0, len(a.nodes))
	for _, n := range a.nodes {
		if n.runID != "" {
			nodes = append(nodes, known{n.client, n.runID})
		}
	}
	a.mu.Unlock()
	for _, n := range nodes {
		ctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
		_, runID, err := identify(ctx, n.c)
		cancel()
		if err == nil && runID != n.runID {
			return true
		}
	}
	return false
}
