//go:build unix

package memorypolicy

import (
	"syscall"
	"time"
)

// processCPU is the CPU the kernel counted for this process (user and
// system), in seconds; 0 if it cannot be read.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
