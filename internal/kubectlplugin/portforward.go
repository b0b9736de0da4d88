package kubectlplugin

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// A sidecar's /debug listens on the pod's loopback address only, so the
// plugin reaches it the way `kubectl port-forward` does: the API server
// authorizes create on pods/portforward (and get, for the WebSocket
// upgrade) and hands the stream to the kubelet, which connects to the port
// inside the pod's network namespace. Unlike kubectl, the plugin opens no
// local listener: it writes one HTTP request into the forwarded stream and
// reads the answer, so no other process on the laptop can use the tunnel.

// maxAnswerBytes bounds a sidecar's answer (a /debug JSON document is a
// few kilobytes).
const maxAnswerBytes = 4 << 20

// forward sends method target (path and query) to the target's debug
// port through a port-forward and returns the status and body.
func (c *Client) forward(ctx context.Context, t Target, method, target string, header http.Header) (int, []byte, error) {
	conn, err := c.dialPortForward(t)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = conn.Close() }()
	// Streams know no context: closing the connection ends them.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	// As kubectl: an error stream (the kubelet writes there why it could
	// not connect) and a data stream, both naming the port.
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(int(t.Port)))
	h.Set(corev1.PortForwardRequestIDHeader, "0")
	errStream, err := conn.CreateStream(h)
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: creating the error stream: %w", err)
	}
	_ = errStream.Close() // nothing to write there
	remoteErr := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(errStream, 64<<10))
		remoteErr <- strings.TrimSpace(string(b))
	}()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(h)
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: creating the data stream: %w", err)
	}
	defer func() { _ = data.Reset() }()

	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+target, nil)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	req.Close = true // one request per stream
	if err := req.Write(data); err != nil {
		return 0, nil, c.forwardError(ctx, remoteErr, fmt.Errorf("port-forward: sending the request: %w", err))
	}
	resp, err := http.ReadResponse(bufio.NewReader(data), req)
	if err != nil {
		return 0, nil, c.forwardError(ctx, remoteErr, fmt.Errorf("port-forward: reading the answer: %w", err))
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return 0, nil, fmt.Errorf("port-forward: reading the answer: %w", err)
	}
	if len(body) > maxAnswerBytes {
		return 0, nil, fmt.Errorf("port-forward: the answer is over %d bytes", maxAnswerBytes)
	}
	return resp.StatusCode, body, nil
}

// forwardError prefers the kubelet's reason (e.g. nothing listens on the
// port) to err, the local symptom of it.
func (c *Client) forwardError(ctx context.Context, remoteErr <-chan string, err error) error {
	select {
	case msg := <-remoteErr:
		if msg != "" {
			return fmt.Errorf("port-forward: %s", msg)
		}
	case <-ctx.Done():
	}
	return err
}

// dialPortForward opens a port-forward connection to t's pod: a WebSocket
// first, SPDY if the API server (or a proxy in front of it) refuses the
// upgrade, as kubectl does.
func (c *Client) dialPortForward(t Target) (streamhttp.Connection, error) {
	u := c.kube.CoreV1().RESTClient().Post().
		Namespace(t.Namespace).Resource("pods").Name(t.Pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(c.cfg)
	if err != nil {
		return nil, err
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, c.cfg)
	if err != nil {
		return nil, err
	}
	dialer = portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
	})
	conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", t.Pod, err)
	}
	return conn, nil
}

// forbidden reports whether a port-forward failed on the API server's 403
// (client-go reports a failed upgrade by its text only).
func forbidden(err error) bool {
	s := err.Error()
	return strings.Contains(s, " is forbidden: ") || strings.Contains(s, "403 Forbidden")
}
