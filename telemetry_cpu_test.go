package subscriptions_test

import (
	"syscall"
	"time"
)

// telemetryProcessCPU is the process's user and system CPU time so far.
func telemetryProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
