package redisadmin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
)

// identify reads whether the server is a master, and its run_id.
func identify(ctx context.Context, c *redis.Client) (master bool, runID string, err error) {
	info, err := c.Info(ctx, "server", "replication").Result()
	if err != nil {
		return false, "", fmt.Errorf("INFO: %w", err)
	}
	runID, role := infoField(info, "run_id"), infoField(info, "role")
	if runID == "" || role == "" {
		return false, "", fmt.Errorf("INFO has no run_id or role")
	}
	return role == "master", runID, nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// unauthenticated reports whether the server at addr answers a PING sent
// without credentials: then anything that reaches it may do what its
// default user may, whatever the identities slidegate hands out.
func (a *Admin) unauthenticated(ctx context.Context, addr string) bool {
	cfg := a.o.Redis
	cfg.Mode, cfg.Addrs, cfg.MasterName = redisconn.Standalone, []string{addr}, ""
	cfg.Username, cfg.Password, cfg.CredentialsDir, cfg.SentinelUsername, cfg.SentinelPassword = "", "", "", "", ""
	cfg.PoolSize = 1
	c, err := redisconn.NewClient(cfg)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	return c.Ping(ctx).Err() == nil
}

// discover finds the deployment's nodes, keeps a client to each (closing
// those of nodes that are gone) and returns them by address.
func (a *Admin) discover(ctx context.Context) ([]*node, error) {
	ctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
	defer cancel()
	var addrs []string
	var err error
	switch a.o.Redis.Mode {
	case redisconn.Cluster:
		addrs, err = a.clusterNodes(ctx)
	case redisconn.Sentinel:
		addrs, err = a.sentinelNodes(ctx)
	default:
		addrs = a.o.Redis.Addrs
	}
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, addr := range addrs {
		want[addr] = true
		if a.nodes[addr] != nil {
			continue
		}
		c, err := a.client(addr)
		if err != nil {
			return nil, err
		}
		a.nodes[addr] = &node{addr: addr, client: c, users: map[string]string{}}
	}
	for addr, n := range a.nodes {
		if !want[addr] {
			_ = n.client.Close()
			delete(a.nodes, addr)
		}
	}
	out := slices.Collect(maps.Values(a.nodes))
	slices.SortFunc(out, func(x, y *node) int { return strings.Compare(x.addr, y.addr) })
	return out, nil
}

// client is an administrative client of the one server at addr.
func (a *Admin) client(addr string) (*redis.Client, error) {
	cfg := a.o.Redis
	cfg.Mode, cfg.Addrs, cfg.MasterName, cfg.DB = redisconn.Standalone, []string{addr}, "", 0
	cfg.PoolSize = 2
	c, err := redisconn.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return c.(*redis.Client), nil
}

// clusterNodes asks the first node that answers, of the seeds and the
// nodes known, for CLUSTER NODES: every master and replica with an
// address.
func (a *Admin) clusterNodes(ctx context.Context) ([]string, error) {
	tried := map[string]bool{}
	var errs []error
	for _, addr := range append(slices.Clone(a.o.Redis.Addrs), slices.Sorted(maps.Keys(a.nodes))...) {
		if tried[addr] {
			continue
		}
		tried[addr] = true
		c := a.nodes[addr]
		var client *redis.Client
		if c != nil {
			client = c.client
		} else {
			nc, err := a.client(addr)
			if err != nil {
				return nil, err
			}
			defer func() { _ = nc.Close() }()
			client = nc
		}
		out, err := client.ClusterNodes(ctx).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("CLUSTER NODES on %s: %w", addr, err))
			continue
		}
		return parseClusterNodes(out, addr), nil
	}
	return nil, errors.Join(errs...)
}

// parseClusterNodes reads the addresses of CLUSTER NODES, as asked of
// from: nodes without an address (noaddr, a handshake) are left out; an
// empty announced IP is from's host (a node that knows no IP of its own).
func parseClusterNodes(out, from string) []string {
	fromHost, _, _ := net.SplitHostPort(from)
	var addrs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || strings.Contains(f[2], "noaddr") || strings.Contains(f[2], "handshake") {
			continue
		}
		hostPort, _, _ := strings.Cut(f[1], "@")
		host, port, err := net.SplitHostPort(hostPort)
		if err != nil || port == "0" {
			continue
		}
		if host == "" {
			host = fromHost
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

// sentinelNodes asks the first sentinel that answers for the master and
// its replicas (those it does not consider down).
func (a *Admin) sentinelNodes(ctx context.Context) ([]string, error) {
	o, err := a.o.Redis.UniversalOptions()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, addr := range a.o.Redis.Addrs {
		s := redis.NewSentinelClient(&redis.Options{
			Addr: addr, Username: o.SentinelUsername, Password: o.SentinelPassword, TLSConfig: o.TLSConfig, Dialer: o.Dialer,
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true, MaxRetries: -1,
		})
		addrs, err := sentinelAsk(ctx, s, a.o.Redis.MasterName)
		_ = s.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("sentinel %s: %w", addr, err))
			continue
		}
		return addrs, nil
	}
	return nil, errors.Join(errs...)
}

func sentinelAsk(ctx context.Context, s *redis.SentinelClient, name string) ([]string, error) {
	master, err := s.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return nil, fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %w", err)
	}
	if len(master) != 2 {
		return nil, fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %q", master)
	}
	addrs := []string{net.JoinHostPort(master[0], master[1])}
	replicas, err := s.Replicas(ctx, name).Result()
	if err != nil {
		return nil, fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	for _, r := range replicas {
		if strings.Contains(r["flags"], "s_down") || strings.Contains(r["flags"], "o_down") || strings.Contains(r["flags"], "disconnected") {
			continue
		}
		if _, err := strconv.Atoi(r["port"]); err == nil && r["ip"] != "" {
			addrs = append(addrs, net.JoinHostPort(r["ip"], r["port"]))
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), nil
}
