package testsupport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ClusterOptions shape a Cluster.
type ClusterOptions struct {
	// Masters is the number of masters, which share the 16384 slots.
	Masters int
	// Replicas is the number of replicas of each master (default 0).
	Replicas int
	// NodeTimeout is cluster-node-timeout (default 5s): how long a node
	// may not answer before the others take it for failed and, if it is a
	// master, one of its replicas starts an election to replace it.
	NodeTimeout time.Duration
	// ReplicationDelay, when set, holds every replication stream this long
	// on its way from a master to its replicas, and a master that dies takes
	// what it held with it: a replica that lags by this much. Each node
	// then announces 127.0.0.2, where a Proxy forwards its port (delaying
	// replication, see ProxyOptions.DelayAfter) and its bus port, and
	// clients are sent to 127.0.0.1 (cluster-announce-hostname with
	// cluster-preferred-endpoint-type hostname: CLUSTER SLOTS and every
	// MOVED and ASK name it), so only replication passes a proxy.
	ReplicationDelay time.Duration
}

// Cluster is a Redis Cluster, each node a Redis on its own port and
// directory. Starting one takes several seconds: start it once per test
// package (in TestMain), not per test.
type Cluster struct {
	Nodes []*Redis

	proxies []*Proxy
}

// ClusterNode is one node as CLUSTER NODES describes it.
type ClusterNode struct {
	ID     string
	Port   int    // the client port
	Master string // the master's ID, for a replica
	Flags  []string
	// Slots are the slot ranges it serves, each [first, last].
	Slots [][2]int
}

// Is reports whether the node has flag (master, slave, fail, myself...).
func (n ClusterNode) Is(flag string) bool {
	for _, f := range n.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

// Serves reports whether the node serves slot.
func (n ClusterNode) Serves(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// NewCluster starts masters redis-server processes with cluster mode on,
// joins them with `redis-cli --cluster create` and waits until every node
// reports cluster_state:ok.
func NewCluster(masters int) (*Cluster, error) {
	return NewClusterWith(ClusterOptions{Masters: masters})
}

// NewClusterWith starts the cluster o describes and waits until every node
// reports cluster_state:ok and every replica is in sync with its master.
func NewClusterWith(o ClusterOptions) (*Cluster, error) {
	cli, err := RedisCLIPath()
	if err != nil {
		return nil, err
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 5 * time.Second
	}
	c := &Cluster{}
	total := o.Masters * (1 + o.Replicas)
	for range total {
		if err := c.addNode(o); err != nil {
			c.Close()
			return nil, err
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitOK(60 * time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// addNode starts one cluster node (with its proxies for a
// ReplicationDelay).
func (c *Cluster) addNode(o ClusterOptions) error {
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10)}
	if o.ReplicationDelay <= 0 {
		n, err := newRedis(freeClusterPort, args...)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
		return nil
	}
	const announce = "127.0.0.2"
	args = append(args, "--cluster-announce-ip", announce,
		"--cluster-announce-hostname", "127.0.0.1", "--cluster-preferred-endpoint-type", "hostname")
	// The proxies must listen before the node announces them, on the
	// node's port numbers: newRedis's port choice starts them.
	var proxies []*Proxy
	closeProxies := func() {
		for _, p := range proxies {
			p.Close()
		}
		proxies = nil
	}
	choose := func() (int, error) {
		closeProxies()
		p, err := freeClusterPort()
		if err != nil {
			return 0, err
		}
		at := func(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
		data, err := NewProxy(at("127.0.0.1", p), ProxyOptions{
			Listen: at(announce, p),
			Delay:  func(time.Time) time.Duration { return o.ReplicationDelay }, DelayAfter: "PSYNC", DropHeld: true,
		})
		if err != nil {
			return 0, err
		}
		proxies = append(proxies, data)
		bus, err := NewProxy(at("127.0.0.1", p+10000), ProxyOptions{Listen: at(announce, p+10000)})
		if err != nil {
			return 0, err
		}
		proxies = append(proxies, bus)
		return p, nil
	}
	n, err := newRedis(choose, args...)
	if err != nil {
		closeProxies()
		return err
	}
	c.Nodes = append(c.Nodes, n)
	c.proxies = append(c.proxies, proxies...)
	return nil
}

// ReplicationProxy is the proxy in front of node's port when the cluster
// has a ReplicationDelay (nil otherwise): its LastDelivered is when the
// node sent the newest replication bytes that reached a replica.
func (c *Cluster) ReplicationProxy(node *Redis) *Proxy {
	for _, p := range c.proxies {
		if _, port, _ := net.SplitHostPort(p.Addr); port == strconv.Itoa(node.Port) {
			return p
		}
	}
	return nil
}

// WaitOK waits until every running node reports cluster_state:ok, knows
// every node, and every running replica's link to its master is up.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, n := range c.Nodes {
		if n.Pid() == 0 {
			continue
		}
		for {
			err := c.nodeOK(n)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster node %s not ready: %w", n.Addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func (c *Cluster) nodeOK(n *Redis) error {
	info, err := n.Do("CLUSTER", "INFO")
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", len(c.Nodes))) {
		return fmt.Errorf("CLUSTER INFO %q", info)
	}
	repl, err := n.Do("INFO", "replication")
	if err != nil {
		return err
	}
	if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
		return errors.New("replica not in sync with its master")
	}
	return nil
}

// Addrs lists the node addresses, the seed list for a cluster client.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Close stops every node.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		n.Close()
	}
	for _, p := range c.proxies {
		p.Close()
	}
}

// Events are the lines of the nodes' logs that tell how the cluster saw
// itself change (a node marked failing, the cluster's state, a failover),
// each after its node's address: for a test's failure message, to tell a
// stalled node from a wrong decision.
func (c *Cluster) Events() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		for _, l := range n.logLines() {
			for _, e := range clusterEvents {
				if strings.Contains(l, e) {
					fmt.Fprintf(&b, "%s %s\n", n.Addr, l)
					break
				}
			}
		}
	}
	return b.String()
}

// clusterEvents are the phrases of redis-server 7's log that Events keeps.
var clusterEvents = []string{"as failing", "Cluster state changed", "FAIL message received",
	"Failover", "failover", "Clear FAIL state"}

// View is CLUSTER NODES as the first running node that answers sees it.
func (c *Cluster) View() ([]ClusterNode, error) {
	lastErr := errors.New("no node is running")
	for _, n := range c.Nodes {
		if n.Pid() == 0 {
			continue
		}
		out, err := n.Do("CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		return parseClusterNodes(out)
	}
	return nil, lastErr
}

func parseClusterNodes(out string) ([]ClusterNode, error) {
	var nodes []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("CLUSTER NODES address %q: %w", f[1], err)
		}
		n := ClusterNode{ID: f[0], Flags: strings.Split(f[2], ",")}
		n.Port, _ = strconv.Atoi(port)
		if f[3] != "-" {
			n.Master = f[3]
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, ok := strings.Cut(s, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("CLUSTER NODES slots %q", s)
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// Node is the node listening on port (nil if none).
func (c *Cluster) Node(port int) *Redis {
	for _, n := range c.Nodes {
		if n.Port == port {
			return n
		}
	}
	return nil
}

// Owner is the master that serves slot, as the cluster sees it now.
func (c *Cluster) Owner(slot int) (*Redis, error) {
	view, err := c.View()
	if err != nil {
		return nil, err
	}
	for _, n := range view {
		if n.Is("master") && !n.Is("fail") && n.Serves(slot) {
			if r := c.Node(n.Port); r != nil {
				return r, nil
			}
		}
	}
	return nil, fmt.Errorf("no master serves slot %d", slot)
}

// ReplicasOf lists the replicas of master.
func (c *Cluster) ReplicasOf(master *Redis) ([]*Redis, error) {
	view, err := c.View()
	if err != nil {
		return nil, err
	}
	id := ""
	for _, n := range view {
		if n.Port == master.Port {
			id = n.ID
		}
	}
	var out []*Redis
	for _, n := range view {
		if id != "" && n.Master == id {
			if r := c.Node(n.Port); r != nil {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// NodeID is the cluster id of n.
func NodeID(n *Redis) (string, error) { return n.Do("CLUSTER", "MYID") }

// MigrateSlot moves slot from the master that serves it to to, the way
// redis-cli --cluster reshard does (StartMigration, MoveAll, Finish),
// calling between after each key. Clients meanwhile meet ASK (a key
// already moved), TRYAGAIN (a command over keys of which some have moved)
// and, at the end, MOVED.
func (c *Cluster) MigrateSlot(slot int, to *Redis, between func()) (moved int, err error) {
	m, err := c.StartMigration(slot, to)
	if err != nil {
		return 0, err
	}
	if moved, err = m.MoveAll(between); err != nil {
		return moved, err
	}
	return moved, m.Finish()
}

// Migration is a slot on its way from one master to another.
type Migration struct {
	c        *Cluster
	slot     string
	from, to *Redis
	toID     string
}

// StartMigration marks slot IMPORTING on to and MIGRATING on the master
// that serves it.
func (c *Cluster) StartMigration(slot int, to *Redis) (*Migration, error) {
	from, err := c.Owner(slot)
	if err != nil {
		return nil, err
	}
	if from == to {
		return nil, fmt.Errorf("slot %d is already on %s", slot, to.Addr)
	}
	fromID, err := NodeID(from)
	if err != nil {
		return nil, err
	}
	toID, err := NodeID(to)
	if err != nil {
		return nil, err
	}
	m := &Migration{c: c, slot: strconv.Itoa(slot), from: from, to: to, toID: toID}
	if _, err := to.Do("CLUSTER", "SETSLOT", m.slot, "IMPORTING", fromID); err != nil {
		return nil, fmt.Errorf("SETSLOT IMPORTING: %w", err)
	}
	if _, err := from.Do("CLUSTER", "SETSLOT", m.slot, "MIGRATING", toID); err != nil {
		return nil, fmt.Errorf("SETSLOT MIGRATING: %w", err)
	}
	return m, nil
}

// MoveKey moves one key of the slot (MIGRATE).
func (m *Migration) MoveKey(key string) error {
	if _, err := m.from.Do("MIGRATE", "127.0.0.1", strconv.Itoa(m.to.Port), key, "0", "5000"); err != nil {
		return fmt.Errorf("MIGRATE %s: %w", key, err)
	}
	return nil
}

// MoveAll moves the keys left in the slot one by one, calling between
// after each, and returns how many it moved.
func (m *Migration) MoveAll(between func()) (moved int, err error) {
	for {
		keys, err := m.from.Do("CLUSTER", "GETKEYSINSLOT", m.slot, "1")
		if err != nil {
			return moved, fmt.Errorf("GETKEYSINSLOT: %w", err)
		}
		if keys == "" {
			return moved, nil
		}
		if err := m.MoveKey(keys); err != nil {
			return moved, err
		}
		moved++
		if between != nil {
			between()
		}
	}
}

// Finish gives the slot to its new master: SETSLOT NODE on it first (so
// that the slot is never without an owner), then on the old one and every
// other master.
func (m *Migration) Finish() error {
	if _, err := m.to.Do("CLUSTER", "SETSLOT", m.slot, "NODE", m.toID); err != nil {
		return fmt.Errorf("SETSLOT NODE on the target: %w", err)
	}
	if _, err := m.from.Do("CLUSTER", "SETSLOT", m.slot, "NODE", m.toID); err != nil {
		return fmt.Errorf("SETSLOT NODE on the source: %w", err)
	}
	view, err := m.c.View()
	if err != nil {
		return err
	}
	for _, n := range view {
		if r := m.c.Node(n.Port); r != nil && r != m.to && r != m.from && n.Is("master") && r.Pid() != 0 {
			if _, err := r.Do("CLUSTER", "SETSLOT", m.slot, "NODE", m.toID); err != nil {
				return fmt.Errorf("SETSLOT NODE on %s: %w", r.Addr, err)
			}
		}
	}
	return nil
}
