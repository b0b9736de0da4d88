// Command sidecar is not built yet (see the open issues); it says so and exits 1
// so that nothing mistakes it for a working binary.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "slidegate sidecar: not built yet")
	os.Exit(1)
}
