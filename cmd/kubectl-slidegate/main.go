// Command kubectl-slidegate is the kubectl plugin `kubectl slidegate`
// (package kubectlplugin): put it on PATH and run `kubectl slidegate why`.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/slidegate/slidegate/internal/kubectlplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := kubectlplugin.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
