package subscriptions_test

import (
	"syscall"
	"time"
)

// processUsage is the process's CPU time (user and system) and its
// threads' voluntary context switches so far: a thread woken to run a
// goroutine and put to sleep again counts one switch, whatever else runs
// on the machine.
func processUsage() (cpu time.Duration, switches int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw
}
