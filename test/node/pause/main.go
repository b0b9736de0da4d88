// Command pause is the node's sandbox image: it holds a pod's namespaces and
// does nothing until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
