package memorypolicy

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const mib = 1 << 20

// at builds a sample: heap and stacks in MiB, the collector's CPU share
// since prev (capacity advancing 10 s a period), with a collection ended
// in the period (the runtime's busy time moved), so it is a reading even
// where the share is nothing.
func at(prev Sample, live, stacks uint64, share float64) Sample {
	return Sample{LiveHeap: live * mib, Stacks: stacks * mib,
		TotalCPU: prev.TotalCPU + 10, GCCPU: prev.GCCPU + 10*share, BusyCPU: prev.BusyCPU + 10}
}

// TestControllerWithoutACollection: the runtime's CPU figures move only
// when a collection ends. A period in which none ended is no reading of
// the collector's cost (the estimate stands, rather than cooling towards
// nothing), and its busy test uses the process's CPU over the capacity
// counted in the period: once, both were the runtime's, so a busy period
// without a collection was never seen as busy.
func TestControllerWithoutACollection(t *testing.T) {
	c := NewController(Settings{})
	s := Sample{LiveHeap: 280 * mib, Stacks: 130 * mib, TotalCPU: 10, BusyCPU: 10, GCCPU: 1}
	c.Decide(s) // primes: no reading yet
	s.TotalCPU, s.BusyCPU, s.GCCPU = 20, 20, 2
	c.Decide(s) // the collector at 10 % of the capacity
	base := c.base
	for range 3 { // quiet periods, no collection ended
		s.TotalCPU += 10
		s.ProcessCPU += 1
		c.Decide(s)
		if c.base != base {
			t.Fatalf("a period without a collection moved the estimate from %.4f to %.4f", base, c.base)
		}
	}
	lowered := c.Percent()
	s.TotalCPU += 10
	s.ProcessCPU += 3 // 30 % of the period's capacity, the runtime's figures unchanged
	if got := c.Decide(s); got != 100 {
		t.Fatalf("a busy period without a collection: GC percent %d (from %d), want the default", got, lowered)
	}
}

// TestGCShare: the collector's share of the capacity is its share of the
// runtime's busy time applied to the CPU the kernel counted, so the
// runtime's wall-time estimates running high on a shared machine do not
// inflate it.
func TestGCShare(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b Sample
		want float64
	}{
		{"no time passed", Sample{TotalCPU: 10}, Sample{TotalCPU: 10, GCCPU: 1}, 0},
		{"runtime figures alone (no busy or process CPU)", Sample{}, Sample{TotalCPU: 10, GCCPU: 1}, 0.1},
		{"the collector was 40 % of the busy time; the process used a fifth of the capacity",
			Sample{}, Sample{TotalCPU: 10, GCCPU: 2, BusyCPU: 5, ProcessCPU: 2}, 0.08},
		{"a busy estimate below the collector's is capped at all of it",
			Sample{}, Sample{TotalCPU: 10, GCCPU: 3, BusyCPU: 2, ProcessCPU: 1}, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gcShare(tc.a, tc.b); got < tc.want-1e-9 || got > tc.want+1e-9 {
				t.Fatalf("gcShare = %.4f, want %.4f", got, tc.want)
			}
		})
	}
}

func TestControllerTarget(t *testing.T) {
	c := NewController(Settings{})
	for _, tc := range []struct {
		name         string
		live, stacks uint64 // MiB
		want         int
	}{
		{"nothing read yet: Go's default", 0, 0, 100},
		{"small server: the 64 MiB floor is more than GOGC=100 gives", 20, 4, 100},
		{"the floor over what is scanned", 100, 28, 50},
		{"15,000 held polls: the floor (a quarter of the live heap is less) over live and stacks", 280, 130, 18},
		{"huge heap: a quarter of the live heap over live and stacks", 4000, 1000, 20},
		{"stacks as large as the live heap: never below 15", 4000, 4000, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.Target(Sample{LiveHeap: tc.live * mib, Stacks: tc.stacks * mib}); got != tc.want {
				t.Fatalf("Target(live %d MiB, stacks %d MiB) = %d, want %d", tc.live, tc.stacks, got, tc.want)
			}
		})
	}
}

// primedAt is a controller whose percent in force is prev and whose
// last sample was at zero CPU: the next sample's CPU share is its own.
func primedAt(prev int) *Controller {
	c := NewController(Settings{})
	c.percent, c.primed = prev, true
	return c
}

// TestControllerDecisions: one period each — the live heap and stacks,
// the collector's share of the CPU capacity over the period at the
// percent in force → the percent decided.
func TestControllerDecisions(t *testing.T) {
	for _, tc := range []struct {
		name         string
		live, stacks uint64 // MiB
		share        float64
		prev, want   int
	}{
		{"small heap: Go's default", 20, 4, 0, 100, 100},
		{"small heap, busy collector: Go's default", 20, 4, 0.3, 100, 100},
		{"mid heap: lowered a quarter towards the floor's 50", 100, 28, 0, 100, 75},
		{"mid heap: at the floor's percent", 100, 28, 0, 57, 50},
		{"large quiet heap: lowered a quarter", 280, 130, 0, 100, 75},
		{"large quiet heap: down to 25", 280, 130, 0, 33, 25},
		{"large quiet heap: a quarter further, towards its target", 280, 130, 0, 25, 19},
		{"large quiet heap: at its target", 280, 130, 0, 19, 18},
		{"large quiet heap: kept at its target", 280, 130, 0, 18, 18},
		{"stacks as large as the live heap: never below 15", 4000, 4000, 0, 16, 15},
		{"huge heap, collector at 4 % at 25: to its target, 20, where the default's 1 % costs 1 % × (5 − 1) = 4 % more, under the bound", 4000, 1000, 0.04, 25, 20},
		{"large heap, collector at 24 % at 25: back up at once to 55", 280, 130, 0.24, 25, 55},
		{"large heap, collector at 32 % at 50: up to 77", 280, 130, 0.32, 50, 77},
		{"large busy heap at the default: lowered only to 75, a quarter", 280, 130, 0.12, 100, 75},
		{"large heap, collector at half the cores: kept near the default", 280, 130, 0.5, 100, 91},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := primedAt(tc.prev)
			s := Sample{LiveHeap: tc.live * mib, Stacks: tc.stacks * mib, TotalCPU: 10, GCCPU: 10 * tc.share}
			if got := c.Decide(s); got != tc.want {
				t.Fatalf("live %d MiB, stacks %d MiB, share %.2f at %d: GC percent %d, want %d",
					tc.live, tc.stacks, tc.share, tc.prev, got, tc.want)
			}
		})
	}
}

// TestControllerStepsBackWhenBusy: a period in which the process used
// more than a fifth of its CPU capacity puts the default percent back at
// once, however large and quiet the collector; below that the policy goes
// on lowering it.
func TestControllerStepsBackWhenBusy(t *testing.T) {
	for _, tc := range []struct {
		name       string
		process    float64 // CPU seconds the process used over the period's 10 s of capacity
		prev, want int
	}{
		{"holding, a tenth of the capacity: lowered", 1, 33, 25},
		{"at the bound, a fifth: lowered", 2, 33, 25},
		{"serving commands, 23 %: the default at once", 2.3, 25, 100},
		{"saturated: the default", 9, 40, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := primedAt(tc.prev)
			s := Sample{LiveHeap: 280 * mib, Stacks: 130 * mib, TotalCPU: 10, ProcessCPU: tc.process}
			if got := c.Decide(s); got != tc.want {
				t.Fatalf("process %.1f s of 10 at %d: GC percent %d, want %d", tc.process, tc.prev, got, tc.want)
			}
		})
	}
}

// TestControllerStepsBackWhenTheMachineIsBusy: a quiet process on a
// machine whose CPUs are busy (other replicas, the database) gets the
// default percent back at once; on a machine with room it goes on
// lowering it, and where the machine's CPU is unknown only its own share
// counts.
func TestControllerStepsBackWhenTheMachineIsBusy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		busy, total float64 // the machine's CPU ticks over the period
		prev, want  int
	}{
		{"machine at 100 %: the default at once", 2000, 2000, 25, 100},
		{"machine at 80 %: the default", 1600, 2000, 33, 100},
		{"machine at 75 %, the bound: lowered", 1500, 2000, 33, 25},
		{"machine at 30 %: lowered", 600, 2000, 33, 25},
		{"machine unknown: lowered", 0, 0, 33, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := primedAt(tc.prev)
			c.last = Sample{MachineBusy: 1000, MachineTotal: 1000}
			if tc.total == 0 {
				c.last = Sample{}
			}
			// A process at a tenth of its capacity: quiet on its own.
			s := Sample{LiveHeap: 280 * mib, Stacks: 130 * mib, TotalCPU: 10, ProcessCPU: 1,
				MachineBusy: c.last.MachineBusy + tc.busy, MachineTotal: c.last.MachineTotal + tc.total}
			if got := c.Decide(s); got != tc.want {
				t.Fatalf("machine %.0f of %.0f ticks busy at %d: GC percent %d, want %d", tc.busy, tc.total, tc.prev, got, tc.want)
			}
		})
	}
}

// TestControllerAtABurstsEnd: the first quiet period after a busy one goes
// straight to the percent the policy wants (its estimate of the
// collector's cost is from quiet periods, which the burst did not move)
// and asks for what the heap holds above that goal to be returned, if it
// is more than the floor; later quiet periods step as before and ask for
// nothing.
func TestControllerAtABurstsEnd(t *testing.T) {
	const live, stacks = 280, 130 // MiB; at 18 the goal is 280 + 410 × 0.18 = 353.8 MiB
	for _, tc := range []struct {
		name    string
		held    uint64 // MiB the heap holds at the burst's end
		release bool
	}{
		{"the burst's heap, far above the goal: returned", 600, true},
		{"within the floor of the goal: left to the scavenger", 353 + 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewController(Settings{})
			prev := Sample{LiveHeap: live * mib, Stacks: stacks * mib}
			c.Decide(prev) // primes
			next := func(process float64, held uint64) Sample {
				s := prev
				s.TotalCPU += 10
				s.ProcessCPU += process
				s.HeapHeld = held * mib
				prev = s
				return s
			}
			if got := c.Decide(next(5, 700)); got != 100 || c.Release() {
				t.Fatalf("busy: GC percent %d, release %v; want the default and no release", got, c.Release())
			}
			if got := c.Decide(next(1, tc.held)); got != 18 {
				t.Fatalf("the burst's end: GC percent %d, want the target, 18, at once (no collector cost measured)", got)
			}
			if c.Release() != tc.release {
				t.Fatalf("the burst's end holding %d MiB: release %v, want %v", tc.held, c.Release(), tc.release)
			}
			if c.Decide(next(1, tc.held)); c.Release() {
				t.Fatal("a second quiet period asked for a release: only a burst's end does")
			}
		})
	}
	t.Run("the burst's collector cost is not the quiet server's", func(t *testing.T) {
		c := NewController(Settings{})
		prev := Sample{LiveHeap: live * mib, Stacks: stacks * mib}
		c.Decide(prev)
		// Each period: the process's CPU and the collector's share of it
		// (a collection ends in every period).
		next := func(process, gcOfProcess float64) Sample {
			s := prev
			s.TotalCPU += 10
			s.ProcessCPU += process
			s.BusyCPU += process
			s.GCCPU += process * gcOfProcess
			prev = s
			return s
		}
		if got := c.Decide(next(1, 0.05)); got != 57 { // quiet: 0.5 % of the capacity at 75, under the bound
			t.Fatalf("quiet: GC percent %d, want 57", got)
		}
		if got := c.Decide(next(8, 0.3)); got != 100 { // re-enrolling: the collector at 24 % of the capacity
			t.Fatalf("busy: GC percent %d, want 100", got)
		}
		// Right after: a collection that mostly ran in the burst ends.
		if got := c.Decide(next(1, 0.3)); got != 18 {
			t.Fatalf("after the burst: GC percent %d, want 18 (the quiet estimate, not the burst's)", got)
		}
		if c.base > 0.01 {
			t.Fatalf("the estimate took the burst in: %.4f", c.base)
		}
	})
	t.Run("quiet periods step a quarter at a time and release nothing", func(t *testing.T) {
		c := NewController(Settings{})
		var prev Sample
		for _, want := range []int{75, 57, 43} {
			s := at(prev, live, stacks, 0)
			s.HeapHeld = 900 * mib
			if got := c.Decide(s); got != want || c.Release() {
				t.Fatalf("GC percent %d, release %v; want %d, none", got, c.Release(), want)
			}
			prev = s
		}
	})
}

// TestParseProcStat reads the aggregate line of /proc/stat.
func TestParseProcStat(t *testing.T) {
	busy, total := parseProcStat([]byte("cpu  100 5 50 800 20 3 2 10 0 0\ncpu0 50 2 25 400 10 1 1 5 0 0\n"))
	if busy != 170 || total != 990 {
		t.Fatalf("busy %v total %v, want 170 and 990", busy, total)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if b, tot := parseProcStat([]byte(bad)); b != 0 || tot != 0 {
			t.Fatalf("%q read as %v of %v", bad, b, tot)
		}
	}
}

// TestControllerSequences walks the controller through periods (live
// heap, stacks, the collector's share since the last) from its start.
func TestControllerSequences(t *testing.T) {
	type step struct {
		live, stacks uint64 // MiB
		share        float64
		want         int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a large quiet heap is lowered a quarter at a time to its target", []step{
			{280, 130, 0, 75}, {280, 130, 0, 57}, {280, 130, 0, 43}, {280, 130, 0, 33}, {280, 130, 0, 25}, {280, 130, 0, 19},
			{280, 130, 0, 18}, {280, 130, 0, 18},
		}},
		{"a busy spell raises it at once; it comes down as the readings cool", []step{
			{280, 130, 0, 75}, {280, 130, 0, 57}, {280, 130, 0, 43}, {280, 130, 0, 33}, {280, 130, 0, 25},
			// 40 % at 25: the default would have cost 10 %; the estimate
			// moves a quarter of the way there, to 2.5 % → 34.
			{280, 130, 0.4, 34},
			{280, 130, 0, 28}, // 1.9 % → 28; a quarter down from 34 would be 26
			{280, 130, 0, 22}, // 1.4 % → 22; a quarter down from 28 would be 21
			{280, 130, 0, 18}, // 1.1 % → 18, the target
			{280, 130, 0, 18},
		}},
		{"a sustained busy spell climbs towards the default", []step{
			{280, 130, 0, 75}, {280, 130, 0, 57}, {280, 130, 0, 43}, {280, 130, 0, 33}, {280, 130, 0, 25},
			{280, 130, 0.4, 34}, {280, 130, 0.4, 52}, {280, 130, 0.4, 65}, {280, 130, 0.4, 73},
		}},
		{"a heap that shrinks gets its room back at once", []step{
			{280, 130, 0, 75}, {280, 130, 0, 57}, {280, 130, 0, 43}, {100, 28, 0, 50}, {20, 4, 0, 100},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewController(Settings{})
			var prev Sample
			for i, st := range tc.steps {
				s := at(prev, st.live, st.stacks, st.share)
				if got := c.Decide(s); got != st.want {
					t.Fatalf("step %d (live %d MiB, stacks %d MiB, share %.2f): GC percent %d, want %d",
						i, st.live, st.stacks, st.share, got, st.want)
				}
				prev = s
			}
		})
	}
}

func TestDisabled(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		off  bool
	}{
		{"nothing set: on", nil, false},
		{"switch on: on", map[string]string{EnvSwitch: "on"}, false},
		{"switch off", map[string]string{EnvSwitch: "off"}, true},
		{"switch OFF", map[string]string{EnvSwitch: " OFF "}, true},
		{"operator's GOGC", map[string]string{"GOGC": "100"}, true},
		{"operator's GOGC=off", map[string]string{"GOGC": "off"}, true},
		{"operator's GOMEMLIMIT", map[string]string{"GOMEMLIMIT": "2GiB"}, true},
		{"empty GOGC counts as unset", map[string]string{"GOGC": ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			if got := Disabled(lookup) != ""; got != tc.off {
				t.Fatalf("Disabled(%v) = %q, want off=%v", tc.env, Disabled(lookup), tc.off)
			}
		})
	}
}

// TestRunLeavesAnOperatorsSettingsAlone: with GOGC or GOMEMLIMIT set (or
// the switch off), Run returns without touching the GC percent.
func TestRunLeavesAnOperatorsSettingsAlone(t *testing.T) {
	for _, env := range []map[string]string{{"GOGC": "50"}, {"GOMEMLIMIT": "1GiB"}, {EnvSwitch: "off"}} {
		set := 0
		Run(context.Background(), Options{ // returns at once, or the test hangs
			Lookup:     func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			Read:       func() Sample { t.Fatal("sampled while disabled"); return Sample{} },
			SetPercent: func(int) int { set++; return 100 },
		})
		if set != 0 || Active() {
			t.Fatalf("env %v: SetGCPercent called %d times, active %v", env, set, Active())
		}
	}
}

// TestRunSetsAndRestores: Run sets the controller's percents and puts the
// one it found back when its context ends; a second Run in the process
// does nothing.
func TestRunSetsAndRestores(t *testing.T) {
	var mu sync.Mutex
	var set []int
	setPercent := func(p int) int {
		mu.Lock()
		defer mu.Unlock()
		set = append(set, p)
		return 80 // what was in force before
	}
	var n float64
	read := func() Sample {
		n += 10
		return Sample{LiveHeap: 280 * mib, Stacks: 130 * mib, TotalCPU: n}
	}
	lowered := make(chan struct{})
	var once sync.Once
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Options{Period: time.Millisecond, Lookup: func(string) (string, bool) { return "", false }, Read: read,
			SetPercent: func(p int) int {
				if p < 100 && p != 80 {
					once.Do(func() { close(lowered) })
				}
				return setPercent(p)
			}})
	}()
	<-lowered
	if !Active() {
		t.Fatal("not active while running")
	}
	second := 0
	Run(ctx, Options{Lookup: func(string) (string, bool) { return "", false }, SetPercent: func(int) int { second++; return 0 }})
	if second != 0 {
		t.Fatal("a second Run set the GC percent")
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if set[0] != 100 || set[1] != 75 || set[len(set)-1] != 80 {
		t.Fatalf("percents set %v: want 100 first, 75 next, the found 80 last", set)
	}
	if Active() {
		t.Fatal("still active after Run returned")
	}
}

// TestReadRuntimeCountsCapacityBetweenCollections: the capacity a sample
// carries advances with the clock, whether or not a collection ended
// (the runtime's own total moves only when one does).
func TestReadRuntimeCountsCapacityBetweenCollections(t *testing.T) {
	a := ReadRuntime()
	start := time.Now()
	time.Sleep(50 * time.Millisecond)
	b := ReadRuntime()
	elapsed := time.Since(start).Seconds()
	if got, least := b.TotalCPU-a.TotalCPU, 0.9*float64(runtime.GOMAXPROCS(0))*elapsed; got < least {
		t.Fatalf("capacity advanced %.3f CPU s over %.3f s, want at least %.3f", got, elapsed, least)
	}
}

// TestReadRuntimeHeapHeld: the heap the runtime holds covers what it has
// allocated and not released, which is at least the live heap.
func TestReadRuntimeHeapHeld(t *testing.T) {
	keep := make([][]byte, 64)
	for i := range keep {
		keep[i] = make([]byte, 64<<10)
	}
	runtime.GC()
	s := ReadRuntime()
	runtime.KeepAlive(keep)
	if s.HeapHeld < 4*mib || s.HeapHeld < s.LiveHeap {
		t.Fatalf("heap held %d bytes, live %d: want at least the 4 MiB kept and the live heap", s.HeapHeld, s.LiveHeap)
	}
}

// TestRunReleasesAtABurstsEnd: Run returns the heap when a busy period is
// followed by a quiet one holding far more than the goal, at most once per
// ReleaseEvery however often spells end.
func TestRunReleasesAtABurstsEnd(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
		least int // releases over 40 periods, every fourth of them busy
		most  int
	}{
		{"once within the interval", time.Hour, 1, 1},
		{"at each spell's end once the interval allows", time.Nanosecond, 5, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n, process := 0, 0.0
			read := func() Sample {
				mu.Lock()
				defer mu.Unlock()
				n++
				process++
				if n%4 == 0 {
					process += 5 // a busy period
				}
				return Sample{LiveHeap: 280 * mib, Stacks: 130 * mib, HeapHeld: 900 * mib, TotalCPU: 10 * float64(n), ProcessCPU: process}
			}
			var released atomic.Int64
			counted := Releases()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				Run(ctx, Options{Period: time.Millisecond, Lookup: func(string) (string, bool) { return "", false }, Read: read,
					SetPercent: func(int) int { return 100 }, Release: func() { released.Add(1) }, ReleaseEvery: tc.every})
			}()
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				periods := n
				mu.Unlock()
				if periods >= 40 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("Run did not sample 40 periods")
				}
				time.Sleep(time.Millisecond)
			}
			cancel()
			<-done
			got := int(released.Load())
			if got < tc.least || got > tc.most {
				t.Fatalf("%d releases, want %d to %d", got, tc.least, tc.most)
			}
			if c := int(Releases() - counted); c != got {
				t.Fatalf("counted %d releases, made %d", c, got)
			}
		})
	}
}
