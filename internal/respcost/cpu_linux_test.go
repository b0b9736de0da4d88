package respcost

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time the calling OS thread has used: on a busy
// machine a benchmark's wall time includes waiting for a core, this does
// not.
func threadCPU() (time.Duration, bool) {
	const rusageThread = 1 // RUSAGE_THREAD, Linux only
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
