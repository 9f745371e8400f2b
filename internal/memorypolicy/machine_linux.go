package memorypolicy

import "os"

// machineCPU is the machine's cumulative CPU time from /proc/stat, in
// clock ticks: busy (user, nice, system, irq, softirq, steal) and in all
// (busy, idle and iowait). Zeros if it cannot be read.
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	return parseProcStat(b)
}
