package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// proxyBufferSize is the size of the pooled copy buffers.
const proxyBufferSize = 32 << 10

// bufferPool recycles the reverse proxy's copy buffers. It stores array
// pointers so that Put does not allocate.
type bufferPool struct{ p sync.Pool }

// newBufferPool returns an empty pool of proxyBufferSize buffers.
func newBufferPool() *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { return new([proxyBufferSize]byte) }}}
}

// Get returns a buffer of proxyBufferSize bytes.
func (b *bufferPool) Get() []byte { return b.p.Get().(*[proxyBufferSize]byte)[:] }

// Put keeps buf for reuse; a buffer too small to serve Get is dropped.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) >= proxyBufferSize {
		b.p.Put((*[proxyBufferSize]byte)(buf[:proxyBufferSize]))
	}
}

// NewBufferPool returns the pool of copy buffers the sidecar's reverse proxy
// uses (exported for the benchmark's bare-proxy baseline).
func NewBufferPool() httputil.BufferPool { return newBufferPool() }

// newUpstreamTransport is the client side to the application: keep-alive
// with enough idle connections for the proxied concurrency (the default of
// 2 per host would make most requests open a new connection), no
// environment proxy, no transparent compression (the client's
// Accept-Encoding goes through as sent).
func newUpstreamTransport(o *Options) http.RoundTripper {
	base := &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   o.UpstreamDialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   4096,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ReadBufferSize:        16 << 10,
		WriteBufferSize:       16 << 10,
	}
	h1 := base.Clone()
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	if o.UpstreamProtocol == UpstreamHTTP1 {
		return h1
	}
	h2c := base.Clone()
	h2c.Protocols = new(http.Protocols)
	h2c.Protocols.SetUnencryptedHTTP2(true)
	if o.UpstreamProtocol == UpstreamH2C {
		return h2c
	}
	return protocolSwitch{h1: h1, h2c: h2c}
}

// protocolSwitch forwards HTTP/2 requests over h2c and the others over
// HTTP/1.1 (--upstream-protocol=auto).
type protocolSwitch struct{ h1, h2c http.RoundTripper }

// RoundTrip forwards r over the transport of its protocol version.
func (p protocolSwitch) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.ProtoMajor == 2 {
		return p.h2c.RoundTrip(r)
	}
	return p.h1.RoundTrip(r)
}

// newProxy builds the reverse proxy to the application. It is transparent:
// the application sees the client's Host and the forwarding headers as they
// arrived, with the client's address appended to X-Forwarded-For (the
// application's peer is the sidecar).
func newProxy(upstream *url.URL, transport http.RoundTripper, pool httputil.BufferPool, log *slog.Logger, upstreamErrors interface{ Inc() }) *httputil.ReverseProxy {
	var lastLog atomic.Int64
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = pr.In.Host
			// Rewrite mode strips these from the outbound request; put back
			// what the client sent.
			for _, k := range [...]string{"Forwarded", "X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v, ok := pr.In.Header[k]; ok {
					pr.Out.Header[k] = v
				}
			}
			xff := pr.In.Header["X-Forwarded-For"]
			if host, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				if len(xff) > 0 {
					pr.Out.Header["X-Forwarded-For"] = []string{strings.Join(xff, ", ") + ", " + host}
				} else {
					pr.Out.Header["X-Forwarded-For"] = []string{host}
				}
			} else if len(xff) > 0 {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			dropH2CUpgrade(pr.Out.Header)
		},
		Transport:  transport,
		BufferPool: pool,
		// A cost policy's response cost is measured as the body streams by
		// and charged when it ends (cost.go).
		ModifyResponse: func(resp *http.Response) error {
			meterResponse(resp)
			return nil
		},
		// Responses of unknown length (streams, server-sent events) are
		// flushed as they come regardless; known-length ones are buffered.
		FlushInterval: 0,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			upstreamErrors.Inc()
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				// The client went away; nobody reads an answer.
				return
			}
			// At most one line a second: a dead application must not flood
			// the log.
			if now := time.Now().UnixNano(); now-lastLog.Load() > int64(time.Second) {
				lastLog.Store(now)
				log.Warn("forwarding to the application failed", "upstream", upstream.Redacted(), "error", err)
			}
			badGatewayAnswer.write(w)
		},
	}
}

// dropH2CUpgrade removes an HTTP/1.1 offer to switch to HTTP/2 ("Upgrade:
// h2c"): the application accepting it would turn the connection into an
// HTTP/2 tunnel whose requests never pass the limiter. The request goes on
// in HTTP/1.1, as Envoy does it (envoyproxy/envoy#7981); Java clients send
// the offer on every request. Clients that want HTTP/2 without TLS use
// prior knowledge, which the sidecar serves and limits per request; RFC
// 9113 deprecates the upgrade. Other upgrades (WebSocket) pass.
//
// ReverseProxy has already removed the client's hop-by-hop headers (those
// its Connection lists too) and set "Connection: Upgrade" with the client's
// first Upgrade line, which is what this sees.
func dropH2CUpgrade(h http.Header) {
	h.Del("Http2-Settings")
	var keep []string
	dropped := false
	for _, v := range h.Values("Upgrade") {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if isH2CToken(tok) {
				dropped = true
			} else if tok != "" {
				keep = append(keep, tok)
			}
		}
	}
	if !dropped {
		return
	}
	if len(keep) > 0 {
		h.Set("Upgrade", strings.Join(keep, ", "))
		return
	}
	h.Del("Upgrade")
	h.Del("Connection") // ReverseProxy set it to "Upgrade" alone
}

// isH2CToken reports whether an Upgrade token ("name[/version]") offers
// h2c. Any name that starts with "h2c", in any case, counts: servers of the
// HTTP/2 drafts accept "h2c-14", a lenient one may ignore what follows the
// name ("h2c;q=1"), and dropping a made-up protocol costs nothing.
func isH2CToken(tok string) bool {
	return len(tok) >= 3 && strings.EqualFold(tok[:3], "h2c")
}
