package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
)

// envtest has an API server but no kubelet, and a port-forward goes from
// the API server to the pod's node's kubelet. testKubelet is the one part of
// a kubelet this needs: its /portForward/{namespace}/{pod} endpoint, served
// with the kubelet's own streaming library (k8s.io/cri-streaming, which the
// kubelet and containerd use), connecting to the port on the pod's
// loopback address as containerd does inside the pod's network namespace.
// Here that is the test host's loopback, where the sidecars' debug ports
// listen. The API server finds it through the Node nodeName: address podIP,
// kubelet port this server's; it speaks TLS without checking the kubelet's
// certificate, as a kube-apiserver without --kubelet-certificate-authority
// does. The real kubelet and containerd are test/node's.
const nodeName = "envtest-node"

type testKubelet struct {
	mu sync.Mutex
	// forwards are the pods and ports forwarded, in order.
	forwards []string
}

// startKubelet serves the kubelet endpoint on podIP and registers the Node.
func startKubelet(ctx context.Context) (*testKubelet, func(), error) {
	k := &testKubelet{}
	mux := http.NewServeMux()
	mux.HandleFunc("/portForward/{namespace}/{pod}", func(w http.ResponseWriter, r *http.Request) {
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pod := r.PathValue("namespace") + "/" + r.PathValue("pod")
		portforward.ServePortForward(w, r, forwarder{k: k, pod: pod}, pod, "", opts, time.Minute, 30*time.Second, portforward.SupportedProtocols)
	})
	ln, err := net.Listen("tcp", podIP+":0")
	if err != nil {
		return nil, nil, err
	}
	srv := httptest.NewUnstartedServer(mux)
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.StartTLS()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	if err := admin.Create(ctx, node); err != nil {
		srv.Close()
		return nil, nil, err
	}
	node.Status = corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: podIP}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(ln.Addr().(*net.TCPAddr).Port)}},
	}
	if err := admin.Status().Update(ctx, node); err != nil {
		srv.Close()
		return nil, nil, err
	}
	return k, srv.Close, nil
}

// forwarded lists the pod/port pairs forwarded so far.
func (k *testKubelet) forwarded() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.forwards...)
}

// forwarder connects a forwarded stream to the port on loopback.
type forwarder struct {
	k   *testKubelet
	pod string
}

func (f forwarder) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	f.k.mu.Lock()
	f.k.forwards = append(f.k.forwards, f.pod+":"+strconv.Itoa(int(port)))
	f.k.mu.Unlock()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s: %w", port, f.pod, err)
	}
	defer func() { _ = conn.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	return nil
}
