package core

import (
	"bufio"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nodeward/nodeward/agent/api"
)

// Capabilities are what this agent understands (DECISIONS.md §45),
// reported in its facts at enrollment and on every heartbeat. Add a name
// here when the agent learns a new kind of work.
var Capabilities = []string{api.CapCommands, api.CapConfig, api.CapOutput, api.CapDiag}

// collectFacts observes the machine now. Each fact is an observation with
// its own time; nothing here is cached, so a heartbeat carries what is true
// when it is made.
func (a *Agent) collectFacts() api.Facts {
	host, _ := os.Hostname()
	f := api.Facts{
		Hostname:      host,
		OS:            goruntime.GOOS,
		Arch:          goruntime.GOARCH,
		CPUs:          goruntime.NumCPU(),
		MemoryBytes:   memTotal(),
		DiskFreeBytes: diskFree(a.store.Dir()),
		AgentVersion:  a.cfg.Version,
		Runtimes:      a.rt.Supports(),
		Labels:        a.cfg.Labels,
		Capabilities:  slices.Clone(Capabilities),
		ObservedAt:    a.clock.Now().UTC(),
	}
	return f
}

// diskFree is the space available to the agent in its state directory (where
// artifacts and workloads live), or nil when it cannot be measured: absent
// means unmeasurable, never zero (zero is a full disk).
func diskFree(dir string) *int64 {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return nil
	}
	v := int64(s.Bavail) * int64(s.Bsize)
	return &v
}

// memTotal reads MemTotal from /proc/meminfo (0 where there is none).
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "MemTotal:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) >= 2 {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}
