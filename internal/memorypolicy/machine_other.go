//go:build !linux

package memorypolicy

// machineCPU is unknown off Linux: only the process's own share counts.
func machineCPU() (busy, total float64) { return 0, 0 }
