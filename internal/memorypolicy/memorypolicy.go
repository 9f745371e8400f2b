// Package memorypolicy keeps the Go collector's headroom in proportion to
// what the server holds (issue 13, BENCHMARKS.md "Memory per held poll").
//
// At the default GOGC=100 the collector lets the heap grow to about twice
// the live heap (plus the goroutine stacks' and globals' share) before it
// collects, and a server that allocates a little all the time (lease
// renewals, re-polls) keeps its resident memory near that goal. A server
// holding tens of thousands of long-polls has a large, slowly changing live
// heap, so that doubling is hundreds of megabytes of garbage kept resident.
//
// The policy reads the runtime's own figures every period and sets the GC
// percent so that the headroom is max(Floor, LiveFraction × live) instead
// of the live heap itself, never below MinPercent and never above
// MaxPercent (the default, 100): it only ever gives memory back, and a
// small server is left as Go runs it.
//
// The collector's CPU is bounded: a collection's cost is about the memory
// it scans, and collections come once per headroom allocated, so at GC
// percent p the collector costs about 100/p times what it would at the
// default. From the share of the process's CPU capacity the collector
// took at the percent in force (averaged over the last periods), the
// policy estimates what the default would have cost and keeps the percent high enough that
// the difference stays under ExtraCPU (5 % of the cores): a busy server
// is left near the default, a quiet one with a large heap goes down to
// its target. The percent is raised at once and lowered a quarter at a
// time, so a rising cost is seen before the bound is reached; it never
// goes below MinPercent (15: a collection at most once per 15 % of the
// scanned memory allocated). The percent is of everything the collector
// scans, goroutine stacks included, and a server holding long-polls has
// stacks half the size of its live heap: a floor of 25 left such a server
// a third more headroom than the policy's own max(Floor, LiveFraction ×
// live) (90 MB against 67 at 15,000 held polls); the CPU bound above,
// not that floor, is what keeps its collector affordable (BENCHMARKS.md,
// twenty-second sitting).
//
// A period in which the process was busy (over BusyShare of its CPU
// capacity: serving load, not holding) puts the default back at once:
// there the collector's cost is throughput (measured at saturation, a
// percent near 30 cost the server a tenth of a core) and the tail of the
// requests its marking slows, and the policy only lowers it again, a
// quarter at a time, once the server is quiet.
// So does a period in which the machine's CPUs were busy (over
// MachineBusyShare, from /proc/stat on Linux), whoever used them: several
// replicas and their database on one host each look quiet on their own
// while every cycle one collector adds is taken from the others (a
// 50,000-agent run on two cores held three replicas at GC percent 25, each
// at a quarter of a core, the machine at 100 %). A host with a CPU quota
// of its own (a container) is not seen this way; there only the process's
// share counts.
//
// When a busy spell ends (the first quiet period after a busy one: a fleet
// reconnected to a restarted server, a storm of commands was answered),
// the percent goes straight back to where the policy wants it rather than
// a quarter at a time (the collector's cost is estimated from quiet
// periods only, so the spell has not moved that estimate: the percent
// returns to where the quiet server had it), and if the heap then holds
// more than Floor above that goal, the policy returns it to the OS at
// once (debug.FreeOSMemory: one full collection; at most once a minute).
// Otherwise the runtime's background scavenger returns it at its own pace,
// a few MB a second, and a server that absorbed a reconnecting fleet kept
// that burst's memory for minutes (BENCHMARKS.md, twenty-first sitting).
//
// An operator's explicit GOGC or GOMEMLIMIT wins: the policy then does
// nothing. NODEWARD_MEMORY_POLICY=off turns it off.
package memorypolicy

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// EnvSwitch names the environment variable that turns the policy off
// ("off"); any other value, or none, leaves it on.
const EnvSwitch = "NODEWARD_MEMORY_POLICY"

// Sample is what the controller reads from the runtime each period.
type Sample struct {
	LiveHeap uint64 // bytes marked live by the last collection (/gc/heap/live)
	// HeapHeld is the heap memory the runtime holds from the OS: objects
	// (live or not yet swept), the unused parts of their spans, and free
	// spans not yet returned (/memory/classes/heap/{objects,unused,free}).
	HeapHeld uint64
	Stacks   uint64 // goroutine stack bytes the collector scans (/gc/scan/stack)
	Globals  uint64 // global bytes the collector scans (/gc/scan/globals)
	// GCCPU and BusyCPU are cumulative CPU seconds in the runtime's
	// estimates (/cpu/classes): the collector's own work (assists,
	// dedicated mark workers, pauses; idle mark workers are left out, they
	// run on CPU nobody wanted) and all the work the process's Ps did (the
	// collector's included). The runtime takes them only when a
	// collection ends, so between two samples they say what the
	// collections that ended between them cost, over however long those
	// cycles took, and nothing when none ended. They also count a P's wall
	// time, so on a machine where other processes take the cores they run
	// high: the collector's share of the busy time is applied to
	// ProcessCPU, the CPU the kernel counted for the process (user and
	// system), over TotalCPU, the capacity (GOMAXPROCS × wall time), both
	// read when the sample is.
	GCCPU      float64
	BusyCPU    float64
	TotalCPU   float64
	ProcessCPU float64
	// MachineBusy and MachineTotal are the machine's cumulative CPU time,
	// all processes, busy and in all (any unit; 0 where unknown).
	MachineBusy  float64
	MachineTotal float64
}

// gcShare is the collector's share of the process's CPU capacity between
// two samples, at the rate of the collections that ended between them.
func gcShare(a, b Sample) float64 {
	total := b.TotalCPU - a.TotalCPU
	if total <= 0 {
		return 0
	}
	gc, busy, proc := b.GCCPU-a.GCCPU, b.BusyCPU-a.BusyCPU, b.ProcessCPU-a.ProcessCPU
	if busy > 0 && proc > 0 {
		return min(max(gc/busy, 0), 1) * proc / total
	}
	return max(gc/total, 0)
}

// Settings bound the policy's decisions. Zero fields take the defaults.
type Settings struct {
	Floor        uint64  // the least headroom the policy leaves, bytes (64 MiB)
	LiveFraction float64 // headroom as a share of the live heap, when larger than Floor (0.25)
	MinPercent   int     // the lowest GC percent the policy sets (15)
	MaxPercent   int     // the highest, and where it starts (100: Go's default)
	// ExtraCPU bounds the collector's CPU the policy may add over what the
	// default percent would cost, as a share of the process's CPU
	// capacity (0.05).
	ExtraCPU float64
	// BusyShare: a period in which the process used more than this share
	// of its CPU capacity puts the default percent back at once (0.2).
	// A busy server's collector costs throughput, and its headroom is
	// what it works in; the policy is for servers that mostly hold. At a
	// low percent every collection's marking also slows the requests in
	// flight: 15,000 agents held on two cores use a tenth of the
	// capacity, 100 commands/s to them 0.23–0.25, and a quarter left that
	// load at the lowest percent with a p99 up to twice the default's;
	// a fifth sits between the two (BENCHMARKS.md, twentieth sitting).
	BusyShare float64
	// MachineBusyShare: a period in which the machine's CPUs were busier
	// than this share puts the default percent back at once too (0.75).
	MachineBusyShare float64
}

func (s Settings) withDefaults() Settings {
	if s.Floor == 0 {
		s.Floor = 64 << 20
	}
	if s.LiveFraction == 0 {
		s.LiveFraction = 0.25
	}
	if s.MinPercent == 0 {
		s.MinPercent = 15
	}
	if s.MaxPercent == 0 {
		s.MaxPercent = 100
	}
	if s.ExtraCPU == 0 {
		s.ExtraCPU = 0.05
	}
	if s.BusyShare == 0 {
		s.BusyShare = 0.2
	}
	if s.MachineBusyShare == 0 {
		s.MachineBusyShare = 0.75
	}
	return s
}

// Controller turns samples into GC percents. It keeps the last sample and
// the percent in force; it is not safe for concurrent use.
type Controller struct {
	s       Settings
	percent int
	last    Sample
	primed  bool
	base    float64 // the collector's estimated share at the default percent (smoothed)
	based   bool    // base holds a reading
	busy    bool    // the last period was busy
	release bool    // Decide asks for the heap above the goal to be returned now
}

// NewController starts at s.MaxPercent.
func NewController(s Settings) *Controller {
	s = s.withDefaults()
	return &Controller{s: s, percent: s.MaxPercent}
}

// Percent is the GC percent the controller last decided.
func (c *Controller) Percent() int { return c.percent }

// Target is the GC percent that leaves the wanted headroom for a sample:
// max(Floor, LiveFraction × live) over the memory the collector scans,
// within [MinPercent, MaxPercent]. (Go's heap goal is live + (live +
// stacks + globals) × GOGC/100.)
func (c *Controller) Target(s Sample) int {
	scan := float64(s.LiveHeap + s.Stacks + s.Globals)
	if scan == 0 {
		return c.s.MaxPercent
	}
	head := math.Max(float64(c.s.Floor), c.s.LiveFraction*float64(s.LiveHeap))
	return clamp(int(math.Ceil(100*head/scan)), c.s.MinPercent, c.s.MaxPercent)
}

// CPUBound is the lowest GC percent at which the collector, costing
// base (a share of capacity) at the default percent, would cost at most
// ExtraCPU more: base × (MaxPercent/p − 1) ≤ ExtraCPU.
func (c *Controller) CPUBound(base float64) int {
	if base <= 0 {
		return 0
	}
	return int(math.Ceil(float64(c.s.MaxPercent) * base / (c.s.ExtraCPU + base)))
}

// Decide takes this period's sample and answers the GC percent to set.
// The collector's CPU share is measured since the previous sample (none
// on the first: it counts as nothing).
func (c *Controller) Decide(s Sample) int {
	busy := false
	if c.primed && s.TotalCPU > c.last.TotalCPU {
		busy = s.ProcessCPU > c.last.ProcessCPU && (s.ProcessCPU-c.last.ProcessCPU)/(s.TotalCPU-c.last.TotalCPU) > c.s.BusyShare
		if total := s.MachineTotal - c.last.MachineTotal; total > 0 && (s.MachineBusy-c.last.MachineBusy)/total > c.s.MachineBusyShare {
			busy = true
		}
		// A period in which no collection ended has no reading of the
		// collector's cost (the runtime's figures did not move): it is
		// not a reading of nothing. Nor is a busy period, or the one right
		// after it (a collection ending then mostly ran in the busy one):
		// busy periods run at the default whatever the estimate, and the
		// estimate is of the collector's cost while the server holds —
		// a burst's cost (a fleet re-enrolling) is its load's, and counted
		// in it would hold the percent up for minutes after.
		if !busy && !c.busy && (s.GCCPU != c.last.GCCPU || s.BusyCPU != c.last.BusyCPU) {
			share := gcShare(c.last, s)
			// What the default would have cost over the same period,
			// moved a quarter of the way towards each new reading:
			// collections are events, so one reading says little; the
			// average over the last several is the collector's cost.
			base := share * float64(c.percent) / float64(c.s.MaxPercent)
			if !c.based {
				c.base, c.based = base, true
			} else {
				c.base += (base - c.base) / 4
			}
		}
	}
	c.last, c.primed = s, true
	want := clamp(max(c.Target(s), c.CPUBound(c.base)), c.s.MinPercent, c.s.MaxPercent)
	burstEnded := c.busy && !busy
	c.busy = busy
	c.release = false
	switch {
	case busy:
		want = c.s.MaxPercent
	case burstEnded:
		// A burst (a fleet reconnecting, a storm of commands) grew the
		// heap at the default percent; it is over, so the percent goes
		// back to where the quiet server had it (the estimate is of
		// quiet periods only) at once, and what the heap holds above
		// that goal is returned now rather than over minutes by the
		// runtime's background scavenger.
		c.release = s.HeapHeld > c.goal(s, want)+c.s.Floor
	case want < c.percent:
		// Lower a quarter at a time.
		want = max(want, c.percent-max(c.percent/4, 1))
	}
	c.percent = want
	return c.percent
}

// goal is the heap goal at GC percent p for a sample.
func (c *Controller) goal(s Sample, p int) uint64 {
	return s.LiveHeap + (s.LiveHeap+s.Stacks+s.Globals)*uint64(p)/100
}

// Release reports whether the last Decide asked for the heap held above
// its goal to be returned to the OS now.
func (c *Controller) Release() bool { return c.release }

func clamp(v, lo, hi int) int { return min(max(v, lo), hi) }

// Disabled answers why the policy must not run in this process ("" when
// it may): the switch is off, or the operator chose the collector's
// settings (GOGC or GOMEMLIMIT set).
func Disabled(lookup func(string) (string, bool)) string {
	if v, _ := lookup(EnvSwitch); strings.EqualFold(strings.TrimSpace(v), "off") {
		return EnvSwitch + "=off"
	}
	for _, name := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, ok := lookup(name); ok && v != "" {
			return name + " is set"
		}
	}
	return ""
}

var (
	active   atomic.Bool
	releases atomic.Int64
)

// Active reports whether a policy runs in this process now.
func Active() bool { return active.Load() }

// Releases counts the times a policy in this process returned a burst's
// heap to the OS.
func Releases() int64 { return releases.Load() }

// GCPercent is the GC percent in force in this process, whoever set it
// (-1: collection off).
func GCPercent() float64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return math.NaN()
	}
	v := s[0].Value.Uint64()
	if v == math.MaxUint64 { // GOGC=off
		return -1
	}
	return float64(v)
}

// Options configure Run. Zero fields take the defaults.
type Options struct {
	Settings Settings
	Period   time.Duration // 2 s
	Log      *slog.Logger
	// Lookup reads the environment (os.LookupEnv).
	Lookup func(string) (string, bool)
	// Read samples the runtime (ReadRuntime); SetPercent sets the GC
	// percent (debug.SetGCPercent). Tests replace both.
	Read       func() Sample
	SetPercent func(int) int
	// Release returns the heap's free memory to the OS at once
	// (debug.FreeOSMemory: a full collection, then every free page), at
	// most once per ReleaseEvery (1 minute).
	Release      func()
	ReleaseEvery time.Duration
}

// Run applies the policy every period until ctx ends, then puts back the
// GC percent it found. It returns at once when Disabled says so (logged).
// At most one Run may be active in a process: the GC percent is the
// process's; a second returns at once.
func Run(ctx context.Context, o Options) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Lookup == nil {
		o.Lookup = os.LookupEnv
	}
	if o.Read == nil {
		o.Read = ReadRuntime
	}
	if o.SetPercent == nil {
		o.SetPercent = debug.SetGCPercent
	}
	if o.Release == nil {
		o.Release = debug.FreeOSMemory
	}
	if o.ReleaseEvery <= 0 {
		o.ReleaseEvery = time.Minute
	}
	if o.Period <= 0 {
		o.Period = 2 * time.Second
	}
	if why := Disabled(o.Lookup); why != "" {
		o.Log.Info("memory policy off: the collector runs as configured", "reason", why)
		return
	}
	if !active.CompareAndSwap(false, true) {
		return
	}
	defer active.Store(false)
	c := NewController(o.Settings)
	found := o.SetPercent(c.Percent())
	defer o.SetPercent(found)
	o.Log.Info("memory policy on: the collector's headroom follows the live heap",
		"floor_mib", c.s.Floor>>20, "min_gc_percent", c.s.MinPercent, "max_gc_percent", c.s.MaxPercent)
	t := time.NewTicker(o.Period)
	defer t.Stop()
	var lastRelease time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		prev := c.Percent()
		if p := c.Decide(o.Read()); p != prev {
			o.SetPercent(p)
			o.Log.Debug("memory policy: GC percent", "from", prev, "to", p)
		}
		// Spells that come and go every few seconds would otherwise
		// have a full collection and the pages faulted back in each time.
		if c.Release() && (lastRelease.IsZero() || time.Since(lastRelease) >= o.ReleaseEvery) {
			lastRelease = time.Now()
			held, goal := c.last.HeapHeld, c.goal(c.last, c.percent)
			o.Release()
			releases.Add(1)
			o.Log.Info("memory policy: a busy spell ended; the heap it grew is returned to the OS",
				"heap_held_mib", held>>20, "heap_goal_mib", goal>>20, "gc_percent", c.percent)
		}
	}
}

var runtimeNames = []string{
	"/gc/heap/live:bytes",
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
	"/cpu/classes/gc/mark/assist:cpu-seconds",
	"/cpu/classes/gc/mark/dedicated:cpu-seconds",
	"/cpu/classes/gc/pause:cpu-seconds",
	"/cpu/classes/total:cpu-seconds",
	"/cpu/classes/idle:cpu-seconds",
	"/cpu/classes/gc/mark/idle:cpu-seconds",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

// ReadRuntime samples this process's runtime/metrics.
func ReadRuntime() Sample {
	ss := make([]metrics.Sample, len(runtimeNames))
	for i, n := range runtimeNames {
		ss[i].Name = n
	}
	metrics.Read(ss)
	u := func(i int) uint64 {
		if ss[i].Value.Kind() == metrics.KindUint64 {
			return ss[i].Value.Uint64()
		}
		return 0
	}
	f := func(i int) float64 {
		if ss[i].Value.Kind() == metrics.KindFloat64 {
			return ss[i].Value.Float64()
		}
		return 0
	}
	busy, total := machineCPU()
	// The capacity is counted here, not read from the runtime's
	// /cpu/classes/total, which moves only when a collection ends: a
	// period without one would have no capacity, and the next would
	// spread its CPU over every period since (the busy bound then almost
	// never saw a busy period; BENCHMARKS.md, twentieth sitting).
	capacity := float64(runtime.GOMAXPROCS(0)) * time.Since(processStart).Seconds()
	return Sample{LiveHeap: u(0), HeapHeld: u(9) + u(10) + u(11), Stacks: u(1), Globals: u(2),
		GCCPU: f(3) + f(4) + f(5), TotalCPU: capacity, BusyCPU: f(6) - f(7) - f(8), ProcessCPU: processCPU(),
		MachineBusy: busy, MachineTotal: total}
}

// processStart is the origin of the capacity ReadRuntime counts.
var processStart = time.Now()

// GCCPUSeconds is the CPU the collector has spent in this process, in the
// runtime's estimate: assists, dedicated mark workers and pauses (idle
// mark workers left out). It counts wall time a P spent, so it runs high
// where other processes take the cores.
func GCCPUSeconds() float64 { return ReadRuntime().GCCPU }

// parseProcStat reads the aggregate "cpu" line of /proc/stat.
func parseProcStat(b []byte) (busy, total float64) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, 0
	}
	var v [8]float64 // user nice system idle iowait irq softirq steal
	for i := range v {
		n, err := strconv.ParseUint(string(f[i+1]), 10, 64)
		if err != nil {
			return 0, 0
		}
		v[i] = float64(n)
	}
	busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	return busy, busy + v[3] + v[4]
}
