package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/sidecar"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Issue 27's "Measure": time to first byte and bytes/s of a streaming
// response (a model server's Server-Sent Events) through the sidecar with a
// response-cost policy (the usage read from the stream as it passes,
// charged at its end), against the bare hop.
const (
	streamEvents     = 20
	streamTokens     = 500 // the usage event's total_tokens
	streamHeading    = "### Streaming responses: time to first byte and bytes/s (issue 27)"
	streamPathPrefix = "/stream"
)

// streamEvent is one ~100-byte chunk of a model's answer, as OpenAI
// streams them.
var streamEvent = []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("t", 40) + "\"}}]}\n\n")

var streamEnd = []byte(fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n",
	streamTokens/5, streamTokens-streamTokens/5, streamTokens))

// streamBytes is the length of one stream's body.
var streamBytes = streamEvents*len(streamEvent) + len(streamEnd)

// serveStream is the model server: streamEvents events, each flushed,
// then the usage event and [DONE], as fast as it can write them (so that
// bytes/s is the path's, not the model's).
func serveStream(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl := w.(http.Flusher)
	for range streamEvents {
		_, _ = w.Write(streamEvent)
		fl.Flush()
	}
	_, _ = w.Write(streamEnd)
}

// streamPolicies are the streaming sidecar's: the same per-user key and
// window, by requests (/stream/count) and by the tokens of the stream's
// usage event (/stream/cost); the limits are never reached, and the
// window is an hour so that every charge stays in Redis to be counted.
func streamPolicies() []sidecarconfig.Policy {
	pol := func(name string, limit int64) sidecarconfig.Policy {
		return sidecarconfig.Policy{
			Name: name, ID: "bench/" + name, WindowMillis: 3_600_000, Limit: limit,
			Algorithm: "SlidingLog", FailMode: "Open", Mode: "Enforce",
			Key:   sidecarconfig.Key{Source: sidecarconfig.SourceHeader, Name: "X-User", OnMissing: sidecarconfig.MissingRemoteAddress},
			Match: sidecarconfig.Match{PathPrefixes: []string{streamPathPrefix + "/" + strings.TrimPrefix(name, "stream-")}},
		}
	}
	// The highest limit a policy may have (a run charges ~50,000 tokens
	// per user).
	cost := pol("stream-cost", sidecarconfig.MaxLimit)
	cost.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}}}
	return []sidecarconfig.Policy{cost, pol("stream-count", sidecarconfig.MaxLimit)}
}

// serveStreamSidecar serves a sidecar with streamPolicies on lim.
func serveStreamSidecar(ctx context.Context, opts sidecar.Options, tmp string, lim enforce.Decider) (string, error) {
	cfg := &sidecarconfig.Config{Namespace: "bench", Policies: streamPolicies()}
	minor := 0
	for i := range cfg.Policies {
		minor = max(minor, sidecarconfig.MinMinorOf(&cfg.Policies[i]))
	}
	cfg.Version = sidecarconfig.VersionOf(minor)
	data, err := sidecarconfig.Marshal(cfg)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(tmp, "stream")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	file := filepath.Join(dir, sidecarconfig.FileName)
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return "", err
	}
	opts.ConfigFile = file
	sc, err := sidecar.New(opts, lim, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	if !sc.Ready() {
		return "", fmt.Errorf("streaming sidecar not ready")
	}
	return serveSidecar(ctx, sc)
}

// streamTarget is one way to the model server.
type streamTarget struct {
	name, label, url string // url includes the path
	// charged counts the streams that should have been charged
	// (the response-cost policy's target only).
	charged *atomic.Int64
}

type streamResult struct {
	streamsPerSec, bytesPerSec []float64 // per round, closed loop
	ttfb50, ttfb99             []float64 // per round, ms, open loop
	full50, full99             []float64 // per round, ms, open loop: the whole stream
	bad                        int       // streams not 200 or not whole
}

// stream is one streamed request as user: time to the first byte of the
// body and to its end, from start; ok if it was a 200 and whole.
func stream(c *http.Client, url, user string, start time.Time) (ttfb, full time.Duration, n int, ok bool) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-User", user)
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, 0, false
	}
	defer func() { _ = resp.Body.Close() }()
	var first [1]byte
	if _, err := io.ReadFull(resp.Body, first[:]); err != nil {
		return 0, 0, 0, false
	}
	ttfb = time.Since(start)
	rest, err := io.ReadAll(resp.Body)
	full = time.Since(start)
	n = 1 + len(rest)
	return ttfb, full, n, err == nil && resp.StatusCode == http.StatusOK && n == streamBytes && bytes.HasSuffix(rest, []byte("[DONE]\n\n"))
}

// measureStreams measures the targets in interleaved rounds: a closed loop
// of conc clients (streams/s, bytes/s), then an open loop at 30% of the
// lowest maximum (time to first byte and to the stream's end, from each
// stream's scheduled start).
func measureStreams(c *http.Client, targets []*streamTarget, rounds, conc int, rpsDur, latDur time.Duration) (map[string]*streamResult, int) {
	res := map[string]*streamResult{}
	user := func(i int) string { return "u" + strconv.Itoa(i%1000) }
	closed := func(t *streamTarget, d time.Duration) (float64, float64, int) {
		var streams, total, bad atomic.Int64
		elapsed := workers(conc, d, func(_, i int) {
			_, _, n, ok := stream(c, t.url, user(i), time.Now())
			total.Add(int64(n))
			if !ok {
				bad.Add(1)
				return
			}
			streams.Add(1)
			if t.charged != nil {
				t.charged.Add(1)
			}
		})
		return float64(streams.Load()) / elapsed.Seconds(), float64(total.Load()) / elapsed.Seconds(), int(bad.Load())
	}
	open := func(t *streamTarget, rate int, d time.Duration) ([]time.Duration, []time.Duration, int) {
		n := int(float64(rate) * d.Seconds())
		ttfb, full := make([]time.Duration, n), make([]time.Duration, n)
		var bad atomic.Int64
		offer(rate, d, func(i int, sched time.Time) {
			var ok bool
			ttfb[i], full[i], _, ok = stream(c, t.url, user(i), sched)
			if !ok {
				bad.Add(1)
				return
			}
			if t.charged != nil {
				t.charged.Add(1)
			}
		})
		slices.Sort(ttfb)
		slices.Sort(full)
		return ttfb, full, int(bad.Load())
	}
	for _, t := range targets {
		res[t.name] = &streamResult{}
		_, _, _ = closed(t, 300*time.Millisecond) // connections, scripts
	}
	fmt.Fprintf(os.Stderr, "bench: streams, max throughput, %d rounds of %v per target\n", rounds, rpsDur)
	for range rounds {
		for _, t := range targets {
			sps, bps, bad := closed(t, rpsDur)
			r := res[t.name]
			r.streamsPerSec, r.bytesPerSec = append(r.streamsPerSec, sps), append(r.bytesPerSec, bps)
			r.bad += bad
		}
	}
	lowest := 0.0
	for i, t := range targets {
		if m := median(res[t.name].streamsPerSec); i == 0 || m < lowest {
			lowest = m
		}
	}
	rate := max(50, int(lowest*0.3)/50*50)
	fmt.Fprintf(os.Stderr, "bench: streams, time to first byte at %d streams/s, %d rounds of %v per target\n", rate, rounds, latDur)
	for _, t := range targets {
		_, _, _ = open(t, rate, 300*time.Millisecond)
	}
	for range rounds {
		for _, t := range targets {
			ttfb, full, bad := open(t, rate, latDur)
			r := res[t.name]
			r.ttfb50, r.ttfb99 = append(r.ttfb50, msf(percentile(ttfb, 0.5))), append(r.ttfb99, msf(percentile(ttfb, 0.99)))
			r.full50, r.full99 = append(r.full50, msf(percentile(full, 0.5))), append(r.full99, msf(percentile(full, 0.99)))
			r.bad += bad
		}
	}
	return res, rate
}

// chargedTokens is the tokens the response-cost policy's keys hold:
// every charge of the run, since the window is an hour (a weighted log's
// <key>s hash keeps t, the cost ever admitted). A charge is made as the
// stream ends, possibly just after the client read its last byte: it
// waits up to 5 s for want.
func chargedTokens(ctx context.Context, rdb redis.UniversalClient, want int64) (int64, error) {
	// Every user's sums hash, whatever the sidecar makes of the key's value.
	match := strings.Replace(redisschema.WeightedKey(redisschema.DefaultPrefix, "bench/stream-cost", "X", false), ":X}", ":*}", 1) + "s"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var sum int64
		iter := rdb.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			n, err := rdb.HGet(ctx, iter.Val(), "t").Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return 0, err
			}
			sum += n
		}
		if err := iter.Err(); err != nil {
			return 0, err
		}
		if sum == want || time.Now().After(deadline) {
			return sum, nil
		}
	}
}

// streamReport is the streaming section.
func streamReport(targets []*streamTarget, res map[string]*streamResult, rate, rounds, conc int, rpsDur, latDur time.Duration, charged, want int64, load string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("\n%s\n\n", streamHeading)
	if load != "" {
		p("Measured alone by `go run ./test/bench/sidecar -stream-only -out <this file>` on %s, 1-minute load average %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), load)
	}
	p("A model server streams Server-Sent Events as OpenAI does: %d events of %d bytes, each flushed, then a usage event (`usage.total_tokens` %d) and `[DONE]`, %d bytes in all, written as fast as it can. ",
		streamEvents, len(streamEvent), streamTokens, streamBytes)
	p("The same per-user key (1000 users, header) and window (1h, limits never reached) counting requests, and counting tokens: a response-cost policy (`cost.response.jsonFields: [usage.total_tokens]`), each request a check (`OpCheck`) when it arrives and a charge (`OpCharge`) of the stream's tokens when it ends, the usage read from the stream as it passes (internal/respcost, nothing buffered). Both policies in one sidecar on the real limiter and the bench's redis-server. ")
	p("Max streams/s and bytes/s: closed loop, %d concurrent clients, median of %d interleaved slices of %v. Time to first byte (the first byte of the body) and to the stream's end: open loop at **%d streams/s** for every target (30%% of the lowest maximum), from each stream's scheduled start, the median of %d interleaved slices' percentiles of %v each.\n\n",
		conc, rounds, rpsDur, rate, rounds, latDur)
	base := res["b"]
	p("| target | TTFB p50 | TTFB p99 | whole stream p50 | p99 | max streams/s | MB/s | TTFB p50 ÷ bare hop | TTFB p99 ÷ bare hop | bytes/s ÷ bare hop | streams not whole |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range targets {
		r := res[t.name]
		p("| %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.0f | %.1f | %.2f | %.2f | %.2f | %d |\n", t.label,
			median(r.ttfb50), median(r.ttfb99), median(r.full50), median(r.full99), median(r.streamsPerSec), median(r.bytesPerSec)/1e6,
			median(r.ttfb50)/median(base.ttfb50), median(r.ttfb99)/median(base.ttfb99), median(r.bytesPerSec)/median(base.bytesPerSec), r.bad)
	}
	p("\nMax streams/s of each slice, in round order:\n\n")
	for _, t := range targets {
		var xs []string
		for _, v := range res[t.name].streamsPerSec {
			xs = append(xs, fmt.Sprintf("%.0f", v))
		}
		p("- %s: %s\n", t.label, strings.Join(xs, ", "))
	}
	p("\nTokens charged to the response-cost policy's keys in Redis (the weighted logs' `t`, summed over the 1000 users): %d; streams served through it whole × %d tokens: %d (%s).\n",
		charged, streamTokens, want, map[bool]string{true: "equal", false: "**not equal**"}[charged == want])
	return b.String()
}
