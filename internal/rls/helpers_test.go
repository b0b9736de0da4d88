package rls

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// The 3-master cluster is started once for the package, by the first test
// that needs it (not in TestMain: fuzz workers run TestMain too).
var (
	clusterOnce sync.Once
	cluster     *testsupport.Cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	testsupport.RedisInMain()
	redis.SetLogger(quietLogger{})
	code := m.Run()
	if cluster != nil {
		cluster.Close()
	}
	os.Exit(code)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func sharedCluster(t *testing.T) *testsupport.Cluster {
	t.Helper()
	clusterOnce.Do(func() { cluster, clusterErr = testsupport.NewCluster(3) })
	if clusterErr != nil {
		t.Fatalf("starting the redis cluster: %v", clusterErr)
	}
	return cluster
}

// pol is a policy for tests: ns "t", the given name, domain "edge".
func pol(name string, limit int64, window time.Duration, entries ...rlsconfig.Entry) rlsconfig.Policy {
	return rlsconfig.Policy{
		Namespace: "t", Name: name, ID: rlsconfig.PolicyID("t", name), Domain: "edge",
		Descriptor: entries, WindowMillis: window.Milliseconds(), Limit: limit,
		Algorithm: string(limiter.SlidingLog), FailMode: string(limiter.FailOpen), Mode: sidecarconfig.ModeEnforce,
	}
}

func entry(k string, v ...string) rlsconfig.Entry {
	e := rlsconfig.Entry{Key: k}
	if len(v) > 0 {
		e.Value = v[0]
	}
	return e
}

// writeConfig writes policies as the rendered config in a fresh directory
// and returns the file's path.
func writeConfig(t *testing.T, policies ...rlsconfig.Policy) string {
	t.Helper()
	c := &rlsconfig.Config{Version: rlsconfig.VersionFor(policies), Policies: policies}
	data, err := rlsconfig.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), rlsconfig.FileName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// replica is one RLS server in-process, on a loopback gRPC listener.
type replica struct {
	srv    *Server
	lim    *limiter.Limiter
	client rlsv3.RateLimitServiceClient
}

// startReplica starts a server on its own Redis client and limiter (as a
// separate pod has), loading configFile.
func startReplica(t *testing.T, rc redisconn.Config, configFile string, lo limiter.Options) *replica {
	t.Helper()
	rdb, err := redisconn.NewClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	lim, err := limiter.New(rdb, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	s := New(lim, Options{ConfigFile: configFile, PeerInterval: 50 * time.Millisecond})
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &replica{srv: s, lim: lim, client: rlsv3.NewRateLimitServiceClient(conn)}
}

func standaloneConfig(addr string) redisconn.Config {
	return redisconn.Config{Addrs: []string{addr}}
}

// testPrefix gives each test its own keys on the shared cluster (which
// outlives one run with -count=2).
func testPrefix(t *testing.T) string {
	return "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// The descriptors Envoy's rate limit filter builds from a route's actions:
// remote_address gives ("remote_address", <client ip>), request_headers
// gives (<descriptor_key>, <header value>), generic_key gives
// ("generic_key", <descriptor_value>). Entries of one rate_limits element
// form one descriptor, in the order of its actions.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// headerMap is the response headers as a map, for comparisons.
func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// testMetric reads one series of a counter from the server's registry.
func testMetric(t *testing.T, s *Server, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
