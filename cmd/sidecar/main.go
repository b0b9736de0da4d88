// Command sidecar is slidegate's enforcement sidecar: a reverse proxy in
// front of the application in its pod that admits or rejects every request
// through the shared Redis limiter. Its flags, configuration and run are
// package sidecar's (sidecar.Command), in the shape every slidegate server
// has (cli.Command).
package main

import (
	"os"

	"github.com/slidegate/slidegate/internal/sidecar"
)

func main() { os.Exit(sidecar.Command().Main(nil, os.Args[1:])) }
