//go:build !linux

package respcost

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
