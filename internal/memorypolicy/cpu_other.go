//go:build !unix

package memorypolicy

// processCPU is 0 where getrusage is not available: the collector's share
// is then taken from the runtime's own figures alone (gcShare).
func processCPU() float64 { return 0 }
