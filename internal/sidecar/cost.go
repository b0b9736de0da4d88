package sidecar

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/respcost"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// Cost policies (spec.cost, issue 27): a request is decided by its cost
// when it arrives (limiter.OpDecide), or, when that is 0 or unknown, by a
// check (admitted while the window's cost is under the limit, counting
// nothing); a policy with a response cost has it measured as the response
// streams to the client (package respcost: nothing is buffered) and
// charged when the response ends, even past the limit.

// requestCost is a policy's cost known when the request arrives.
type requestCost struct {
	constant int64
	header   string // canonical; "" for a constant
	def      int64
}

func compileRequestCost(c *sidecarconfig.RequestCost) *requestCost {
	rc := &requestCost{header: http.CanonicalHeaderKey(c.Header)}
	if c.Constant != nil {
		rc.constant = *c.Constant
	}
	if c.Default != nil {
		rc.def = *c.Default
	}
	return rc
}

// of is r's cost: the constant, or the header's one value as a whole
// number in plain digits (above limiter.MaxCost: MaxCost), else the
// default.
func (c *requestCost) of(r *http.Request) int64 {
	if c.header == "" {
		return c.constant
	}
	vs := r.Header[c.header]
	if len(vs) != 1 || vs[0] == "" {
		return c.def
	}
	var n int64
	for i := 0; i < len(vs[0]); i++ {
		d := vs[0][i]
		if d < '0' || d > '9' {
			return c.def
		}
		n = min(n*10+int64(d-'0'), limiter.MaxCost)
	}
	return n
}

// hidden reports whether r's Connection header names c's header: the
// request would be charged a cost the application never sees (see
// connectionNames), so it is refused as for an ambiguous key.
func (c *requestCost) hidden(r *http.Request) bool {
	return c != nil && c.header != "" && len(r.Header[c.header]) > 0 && connectionNames(r.Header, c.header)
}

// costRequest is the limiter request of p for a request whose client key
// is client: its request cost, or a check.
func costRequest(p *policy, rule limiter.Rule, client string, r *http.Request) limiter.Request {
	req := limiter.Request{Rule: rule, Client: client, DryRun: p.dryRun, Op: limiter.OpCheck}
	if p.reqCost != nil {
		if c := p.reqCost.of(r); c > 0 {
			req.Op, req.Hits = limiter.OpDecide, c
		}
	}
	return req
}

// chargesKey is the context key of a forwarded request's pending charges.
type chargesKey struct{}

// charges are the response costs a forwarded request owes: one per policy
// with a response cost that applied to it.
type charges struct {
	lim     enforce.Decider
	charged *prometheus.CounterVec // slidegate_sidecar_cost_charged_total
	drain   time.Duration          // Sidecar.drainMaxTime
	items   []charge
	// stop ends the forwarded request's own context (see withCharges).
	stop context.CancelFunc
}

type charge struct {
	policy string
	rule   *respcost.Rule
	req    limiter.Request // the request's decision, as charged
}

// Bounds of what is still read from the application after the client went
// away mid-response, to find the usage that OpenAI-style streams report
// only in their last event: a client that hangs up just before it would
// otherwise pay the policy's default. Past them the request to the
// application ends, as it would have at once without a response cost,
// and what was read (else the default) is charged.
const drainMaxBytes = 4 << 20

// drainMaxTime is a variable for the tests.
var drainMaxTime = 10 * time.Second

// withCharges returns r carrying the charges that dec's policies with a
// response cost owe once its response ends, and the function that ends
// its request to the application, to call once forwarded; r itself and
// nil when none do.
func (s *Sidecar) withCharges(r *http.Request, dec *decided) (*http.Request, context.CancelFunc) {
	var cs *charges
	for i, p := range dec.policies {
		if p.respCost == nil {
			continue
		}
		if cs == nil {
			cs = &charges{lim: s.lim, charged: s.metrics.costCharged, drain: s.drainMaxTime}
		}
		cs.items = append(cs.items, charge{policy: p.name, rule: p.respCost, req: dec.requests[i]})
	}
	if cs == nil {
		return r, nil
	}
	// The request to the application does not end when the client goes
	// away (its context is not the client's), but drainMaxTime later: the
	// stream's last event, the usage, may still come.
	ctx, stop := context.WithCancel(context.WithoutCancel(r.Context()))
	cs.stop = stop
	hangUp := context.AfterFunc(r.Context(), func() { time.AfterFunc(cs.drain, stop) })
	r = r.WithContext(context.WithValue(ctx, chargesKey{}, cs))
	if _, ok := r.Header["Accept-Encoding"]; ok {
		// A compressed body's usage cannot be read as it streams by, and
		// it would be charged the policy's default: a client could ask for
		// gzip to pay nothing. Without the client's Accept-Encoding, Go's
		// transport asks for gzip itself and hands the proxy the body
		// decoded, which the client then gets uncompressed.
		r.Header = r.Header.Clone()
		delete(r.Header, "Accept-Encoding")
	}
	// Forwarded, the request needs neither (the server cancels the
	// client's context when the handler returns: that is no hang-up).
	return r, func() { hangUp(); stop() }
}

// meterResponse wraps resp's body in a meter per owed charge (the
// reverse proxy's ModifyResponse); its Close charges them.
func meterResponse(resp *http.Response) {
	cs, ok := resp.Request.Context().Value(chargesKey{}).(*charges)
	if !ok {
		return
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// A protocol switch (WebSocket) is a tunnel the proxy needs the
		// body of as it is (an io.ReadWriteCloser), and no usage can be
		// read from it: charged now what its headers report, else the
		// policy's default, never nothing (a client could otherwise pick
		// a tunnel to pay nothing).
		meters := make([]*respcost.Meter, len(cs.items))
		for i, c := range cs.items {
			meters[i] = c.rule.NewMeter(resp.Header, http.NoBody)
		}
		cs.charge(resp, meters)
		return
	}
	mb := &meteredBody{cs: cs, resp: resp, meters: make([]*respcost.Meter, len(cs.items))}
	body := resp.Body
	for i, c := range cs.items {
		mb.meters[i] = c.rule.NewMeter(resp.Header, body)
		body = mb.meters[i]
	}
	mb.ReadCloser = body
	resp.Body = mb
}

// meteredBody passes a response through its meters and charges what they
// measured when the proxy closes it: after the last byte and the trailers
// were sent, or when the client went away mid-stream (then after reading
// the rest, within drainMaxBytes and drainMaxTime, for the usage; else
// what was read, else the policy's default). The charge is made before
// the handler returns, so a draining sidecar waits for it.
type meteredBody struct {
	io.ReadCloser
	cs     *charges
	resp   *http.Response
	meters []*respcost.Meter
	eof    bool
	once   sync.Once
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *meteredBody) Close() error {
	var err error
	b.once.Do(func() {
		if !b.eof {
			t := time.AfterFunc(b.cs.drain, b.cs.stop)
			_, _ = io.Copy(io.Discard, io.LimitReader(b, drainMaxBytes))
			t.Stop()
		}
		err = b.ReadCloser.Close()
		b.cs.stop()
		b.cs.charge(b.resp, b.meters)
	})
	return err
}

// charge charges what meters (one per item, index for index) measured of
// resp, as of now.
func (cs *charges) charge(resp *http.Response, meters []*respcost.Meter) {
	reqs := make([]limiter.Request, 0, len(cs.items))
	for i, c := range cs.items {
		res := meters[i].Cost(resp.Trailer)
		cs.charged.WithLabelValues(c.policy, string(res.Source)).Add(float64(res.Cost))
		if res.Cost == 0 {
			continue
		}
		req := c.req
		req.Op, req.Hits = limiter.OpCharge, res.Cost
		reqs = append(reqs, req)
	}
	if len(reqs) > 0 {
		// The client may be gone; the cost is owed all the same.
		cs.lim.Decide(context.WithoutCancel(resp.Request.Context()), reqs)
	}
}
