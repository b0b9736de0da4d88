// Command demo is `make demo`: slidegate's whole flow on this machine, no
// cluster needed. See test/e2e for what it does; the e2e test asserts the
// same numbers.
//
//	go run ./hack/demo -manager bin/manager -sidecar bin/sidecar
package main

import (
	"flag"
	"os"

	"github.com/slidegate/slidegate/test/e2e"
)

func main() {
	manager := flag.String("manager", "bin/manager", "manager binary")
	sidecar := flag.String("sidecar", "bin/sidecar", "sidecar binary")
	flag.Parse()
	os.Exit(e2e.Main(*manager, *sidecar))
}
