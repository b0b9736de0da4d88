// Command demoapp is the demo's HTTP app on the real node: a stand-in for the
// agnhost image of config/samples/demo_app.yaml (same arguments: netexec
// --http-port=N), so the test deploys the sample unchanged but for the image.
//
// It counts what reaches it, by X-User-ID, so that a test can compare the
// app's own view with what the limiter admitted: GET /stats (not counted)
// returns {"total": N, "byUser": {...}}; GET /hostname (not counted either)
// names the pod, as agnhost's does. GET /dial?host=H&port=P&request=R&tries=N
// (agnhost netexec's, HTTP only) makes N requests from this pod to
// http://H:P/R and answers {"responses": [...], "errors": [...]}: a client
// inside the pod network, for what a NetworkPolicy admits (the node's own
// traffic always passes). On SIGTERM it keeps serving for
// -drain (endpoints and Service rules take a moment to forget a terminating
// pod), then shuts down gracefully.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

type counts struct {
	mu     sync.Mutex
	Total  int            `json:"total"`
	ByUser map[string]int `json:"byUser"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	fs := flag.NewFlagSet("demoapp", flag.ExitOnError)
	port := fs.Int("http-port", 8080, "port to serve on")
	drain := fs.Duration("drain", 5*time.Second, "how long to keep serving after SIGTERM")
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "netexec" { // agnhost's subcommand
		args = args[1:]
	}
	_ = fs.Parse(args)

	c := &counts{ByUser: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c)
	})
	host, _ := os.Hostname()
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, host) })
	mux.HandleFunc("/dial", dial)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.Total++
		c.ByUser[r.Header.Get("X-User-ID")]++
		c.mu.Unlock()
		fmt.Fprintf(w, "%s %s from %s\n", host, r.URL.Path, r.RemoteAddr)
	})
	srv := &http.Server{Addr: fmt.Sprintf(":%d", *port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		<-ctx.Done()
		time.Sleep(*drain)
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Printf("demoapp serving on %s", srv.Addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-drained // Shutdown returns once in-flight requests are answered
	return nil
}

// dial is agnhost netexec's /dial for HTTP: it requests
// http://host:port/request tries times from this pod, each on a new
// connection with a 2 s timeout, and reports the bodies and the errors.
func dial(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tries := 1
	if _, err := fmt.Sscan(q.Get("tries"), &tries); err != nil || tries < 1 || tries > 100 {
		tries = 1
	}
	url := fmt.Sprintf("http://%s/%s", net.JoinHostPort(q.Get("host"), q.Get("port")), q.Get("request"))
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	out := struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}{Responses: []string{}, Errors: []string{}}
	for range tries {
		resp, err := c.Get(url)
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
			continue
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
			continue
		}
		out.Responses = append(out.Responses, strings.TrimSpace(string(body)))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
