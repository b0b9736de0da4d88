/*
Copyright 2026 The slidegate Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/slidegate/slidegate/internal/policystatus"
	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// loaded asks every ready endpoint of the RLS Service what it loaded,
// concurrently, each within the HTTP client's timeout.
func (r *RateLimitServiceReconciler) loaded(ctx context.Context) ([]policystatus.Server, error) {
	var eps discoveryv1.EndpointSliceList
	if err := r.reader().List(ctx, &eps, client.InNamespace(r.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: r.serviceName()}); err != nil {
		return nil, fmt.Errorf("listing the endpoints of Service %s/%s: %w", r.Namespace, r.serviceName(), err)
	}
	var addrs []string
	for _, s := range eps.Items {
		var port int32
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == RLSAdminPortName && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				addrs = append(addrs, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	out := make([]policystatus.Server, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			out[i] = policystatus.Server{Addr: a}
			out[i].Loaded, out[i].Err = r.ask(ctx, a)
		})
	}
	wg.Wait()
	return out, nil
}

// ask gets the policy revisions one server loaded (rlsconfig.Loaded).
func (r *RateLimitServiceReconciler) ask(ctx context.Context, addr string) (map[string]bool, error) {
	c := r.HTTPClient
	if c == nil {
		c = &http.Client{Timeout: 2 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+rlsconfig.LoadedPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", rlsconfig.LoadedPath, resp.Status)
	}
	var l rlsconfig.Loaded
	// A server's answer is bounded by its document (1 MiB at most).
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&l); err != nil {
		return nil, fmt.Errorf("reading %s: %w", rlsconfig.LoadedPath, err)
	}
	return l.Revisions(), nil
}
