// Command rls is slidegate's Envoy rate limit service (RLS v3): gateways
// (Istio, Contour, Envoy Gateway) ask it whether a request may pass, and it
// decides with the same exact limiter and shared Redis as the sidecars. Its
// flags, configuration and run are package rls's (rls.Command), in the
// shape every slidegate server has (cli.Command).
//
//	rls [flags]                 serve
//	rls check -target host:port -domain d -descriptor k=v[,k=v] ...
//	          [-tls -tls-ca-file ca.crt -tls-cert-file tls.crt -tls-key-file tls.key]
//	                            send one request, print the answer
package main

import (
	"os"

	"github.com/slidegate/slidegate/internal/rls"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(rls.CheckMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(rls.Command().Main(nil, os.Args[1:]))
}
