package closedloop

import (
	"os"
	"testing"
	"time"
)

// TestProcCPUAgreesWithGetrusage reads this process's CPU both ways: /proc
// counts in 10 ms ticks, so the two agree within a few ticks.
func TestProcCPUAgreesWithGetrusage(t *testing.T) {
	// Spin until the process has used 100 ms of CPU, however busy the
	// machine is (a wall-clock spin may get a fraction of a core).
	for deadline := time.Now().Add(time.Minute); SelfCPU() < 100*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("getrusage: %v of CPU after a minute of spinning", SelfCPU())
		}
	}
	self := SelfCPU()
	proc, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := self - proc; d < -30*time.Millisecond || d > 30*time.Millisecond {
		t.Errorf("/proc says %v, getrusage %v", proc, self)
	}
	if _, err := ProcCPU(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
