package core

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/state"
)

// hookScript is an apply hook that records each run in runs ("revision hash
// format [first-arg] [path]"), copies the document it was given, holds while
// the file hold exists, notes overlapping runs, then fails (exit 3, with a
// message on stderr) when the file fail exists or outlives any deadline when
// slow exists.
const hookScript = `#!/bin/sh
d="$HOOKDIR"
echo $$ >> "$d/pids"
mkdir "$d/running" 2>/dev/null || echo CONCURRENT >> "$d/runs"
echo "$NODEWARD_CONFIG_REVISION $NODEWARD_CONFIG_HASH $NODEWARD_CONFIG_FORMAT [$1] [$2]" >> "$d/runs"
if [ -n "$2" ]; then cat "$2" > "$d/seen-$NODEWARD_CONFIG_REVISION"; fi
while [ -e "$d/hold" ]; do sleep 0.01; done
if [ -e "$d/slow" ]; then echo "waiting for a lock that never frees"; touch "$d/slept"; sleep 300; fi
rmdir "$d/running"
if [ -e "$d/fail" ]; then echo "starting reload"; echo "nginx: [emerg] unknown directive \"lisen\"" >&2; exit 3; fi
exit 0
`

type hookRig struct {
	t   *testing.T
	dir string
}

// withHook gives the bundle's agents the recording hook, called with a
// leading argument "extra" before the document's path.
func withHook(b *bundle) *hookRig {
	b.t.Helper()
	h := &hookRig{t: b.t, dir: b.t.TempDir()}
	script := filepath.Join(h.dir, "hook.sh")
	body := strings.Replace(hookScript, `d="$HOOKDIR"`, `d="`+h.dir+`"`, 1)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		b.t.Fatal(err)
	}
	b.hook = []string{script, "extra"}
	// A failure says what the hook did (the agent logs each run's pid).
	b.t.Cleanup(func() {
		if b.t.Failed() {
			runs, _ := os.ReadFile(filepath.Join(h.dir, "runs"))
			pids, _ := os.ReadFile(filepath.Join(h.dir, "pids"))
			b.t.Logf("the hook's runs file: %q; the pids of its runs: %q", runs, pids)
		}
	})
	return h
}

func (h *hookRig) set(name string, on bool) {
	h.t.Helper()
	p := filepath.Join(h.dir, name)
	if on {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			h.t.Fatal(err)
		}
		return
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		h.t.Fatal(err)
	}
}

// runs lists the hook's runs, one line each: whole lines only. The shell
// creates the file before it writes the line, and a hook killed between
// the two (the tests stop agents mid-hook) leaves an empty file, which is
// no run (counting it as one once had a test stop the agent before its
// hook had run, then wait forever for a second run).
func (h *hookRig) runs() []string {
	b, err := os.ReadFile(filepath.Join(h.dir, "runs"))
	end := bytes.LastIndexByte(b, '\n')
	if err != nil || end < 0 {
		return nil
	}
	return strings.Split(string(b[:end]), "\n")
}

func (h *hookRig) seen(rev int) string {
	b, _ := os.ReadFile(filepath.Join(h.dir, "seen-"+strconv.Itoa(rev)))
	return string(b)
}

// reportsOf waits for the reports of rev to reach n and returns them.
func (b *bundle) reportsOf(rev int64, n int) []api.ConfigReport {
	b.t.Helper()
	b.eventually("config reports", 0, func() bool { return len(b.cp.configReports(rev)) >= n })
	return b.cp.configReports(rev)
}

// settleAfter waits for n more polls: each answer has been taken (offered,
// dispatched) before the next poll goes out.
func (b *bundle) settleAfter(n int) {
	b.t.Helper()
	from := b.cp.polls()
	b.eventually("more polls", 0, func() bool { return b.cp.polls() >= from+n })
}

func fileMode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestConfig(t *testing.T) {
	t.Run("SetWritesTheFileAndReportsApplied", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		d := b.cp.configure("nginx.site/v1", map[string]any{"listen": 8080, "root": "/srv"})
		r := b.reportsOf(1, 1)
		if r[0].State != api.ConfigApplied || r[0].Hash != d.Hash || r[0].Message != "" {
			t.Fatalf("report %+v", r[0])
		}
		doc := filepath.Join(b.dir, "config", "current.json")
		got, err := os.ReadFile(doc)
		if err != nil || !jsonEqual(got, d.Document) {
			t.Fatalf("current.json %q, %v", got, err)
		}
		var meta state.ConfigMeta
		if err := state.ReadJSON(filepath.Join(b.dir, "config", "current.meta.json"), &meta); err != nil {
			t.Fatal(err)
		}
		if meta != (state.ConfigMeta{Revision: 1, Hash: d.Hash, Format: "nginx.site/v1"}) {
			t.Fatalf("meta %+v", meta)
		}
		for _, p := range []string{doc, filepath.Join(b.dir, "config", "current.meta.json")} {
			if m := fileMode(t, p); m != 0o600 {
				t.Fatalf("%s mode %v", p, m)
			}
		}
		ents, _ := os.ReadDir(filepath.Join(b.dir, "config"))
		for _, e := range ents {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Fatalf("temporary file left behind: %s", e.Name())
			}
		}
		// Reported once: the deliveries that followed were echoes or found
		// the report recorded.
		b.settleAfter(3)
		if n := len(b.cp.configReports(1)); n != 1 {
			t.Fatalf("%d reports", n)
		}
		if st := b.agent.Stats(); st.ConfigApplies != 1 || st.ConfigHookRuns != 0 {
			t.Fatalf("stats %+v", st)
		}
	})

	t.Run("ChangeRunsTheHookWithPathAndEnvironment", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"workers": 2})
		b.reportsOf(1, 1)
		d2 := b.cp.configure("app/v1", map[string]any{"workers": 4})
		r := b.reportsOf(2, 1)
		if r[0].State != api.ConfigApplied || r[0].Hash != d2.Hash {
			t.Fatalf("report %+v", r[0])
		}
		path := filepath.Join(b.dir, "config", "current.json")
		runs := h.runs()
		if len(runs) != 2 || runs[1] != "2 "+d2.Hash+" app/v1 [extra] ["+path+"]" {
			t.Fatalf("hook runs %q", runs)
		}
		if !jsonEqual([]byte(h.seen(2)), d2.Document) {
			t.Fatalf("the hook read %q", h.seen(2))
		}
		if !slices.Contains(b.cp.enrolls[0].Facts.Capabilities, api.CapConfig) {
			t.Fatal("config.v1 not reported")
		}
	})

	t.Run("HookFailureReportedWithItsOutput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		h.set("fail", true)
		b.start(b.cp.bootstrap())
		b.cp.configure("nginx.site/v1", map[string]any{"lisen": 80})
		r := b.reportsOf(1, 1)
		if r[0].State != api.ConfigFailed || !strings.Contains(r[0].Message, "exit status 3") ||
			!strings.Contains(r[0].Message, `unknown directive "lisen"`) || !strings.Contains(r[0].Message, "starting reload") {
			t.Fatalf("report %+v", r[0])
		}
		// Not pushed again until forced: the hook ran once.
		b.settleAfter(5)
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times before a force", n)
		}
		// A forced re-push means "try again".
		h.set("fail", false)
		b.cp.force()
		r = b.reportsOf(1, 2)
		if r[1].State != api.ConfigApplied {
			t.Fatalf("report after force %+v", r[1])
		}
		if n := len(h.runs()); n != 2 {
			t.Fatalf("hook ran %d times", n)
		}
	})

	t.Run("FailedReportNotYetDeliveredIsNotRetriedByEchoes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		h.set("fail", true)
		b.cp.with(func() { b.cp.eventsDown = 1 << 30 })
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.eventually("the failure recorded", 0, func() bool {
			st, ok := b.agent.ConfigStatus()
			return ok && st.State == api.ConfigFailed
		})
		// The server has not heard: it keeps delivering the revision.
		from := 0
		b.cp.with(func() { from = b.cp.cfgDeliveries })
		b.eventually("more deliveries", 0, func() bool {
			n := 0
			b.cp.with(func() { n = b.cp.cfgDeliveries })
			return n >= from+3
		})
		b.settleAfter(1)
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times on echoes", n)
		}
		b.cp.with(func() { b.cp.eventsDown = 0 })
		b.eventually("the failure reported", time.Second, func() bool { return len(b.cp.configReports(1)) == 1 })
		b.settleAfter(3)
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times", n)
		}
	})

	t.Run("HookTimeoutKillsItAndFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		h.set("slow", true)
		b.hookTimeout = 5 * time.Second
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.eventually("the hook to block", 0, func() bool { _, err := os.Stat(filepath.Join(h.dir, "slept")); return err == nil })
		// Fake time passes the deadline; the hook (and its sleep) is killed.
		b.eventually("the timeout reported", time.Second, func() bool { return len(b.cp.configReports(1)) == 1 })
		r := b.cp.configReports(1)[0]
		if r.State != api.ConfigFailed || !strings.Contains(r.Message, "timed out after 5s and was killed") ||
			!strings.Contains(r.Message, "waiting for a lock that never frees") {
			t.Fatalf("report %+v", r)
		}
	})

	t.Run("ClearRemovesTheFileAndRunsTheHookWithNoPath", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.reportsOf(1, 1)
		d := b.cp.configure("app/v1", nil)
		if string(d.Document) != "null" {
			t.Fatalf("document %q", d.Document)
		}
		if r := b.reportsOf(2, 1); r[0].State != api.ConfigApplied {
			t.Fatalf("report %+v", r[0])
		}
		if _, err := os.Stat(filepath.Join(b.dir, "config", "current.json")); !os.IsNotExist(err) {
			t.Fatalf("current.json still there: %v", err)
		}
		var meta state.ConfigMeta
		state.ReadJSON(filepath.Join(b.dir, "config", "current.meta.json"), &meta)
		if meta.Revision != 2 || meta.Hash != d.Hash {
			t.Fatalf("meta %+v", meta)
		}
		if runs := h.runs(); len(runs) != 2 || runs[1] != "2 "+d.Hash+" app/v1 [extra] []" {
			t.Fatalf("hook runs %q", runs)
		}
	})

	t.Run("RestartRemembersAndReportsAgainWithoutTheHook", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		b.start(b.cp.bootstrap())
		d := b.cp.configure("app/v1", map[string]any{"a": 1})
		b.reportsOf(1, 1)
		b.stop()
		b.start(nil)
		r := b.reportsOf(1, 2)
		if r[1] != (api.ConfigReport{Revision: 1, Hash: d.Hash, State: api.ConfigApplied}) {
			t.Fatalf("report after restart %+v", r[1])
		}
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times", n)
		}
		if st, ok := b.agent.ConfigStatus(); !ok || st.Revision != 1 || st.State != api.ConfigApplied {
			t.Fatalf("status %+v", st)
		}
	})

	t.Run("RedeliveryOfTheAppliedRevisionReportsWithoutTheHook", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.reportsOf(1, 1)
		// What a re-enrollment does on the server: due again whatever the
		// last report said.
		b.cp.with(func() { b.cp.cfgLast = nil })
		b.cp.poke()
		if r := b.reportsOf(1, 2); r[1].State != api.ConfigApplied {
			t.Fatalf("report %+v", r[1])
		}
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times", n)
		}
		// And a real re-enrollment (a reinvite) with the same state dir.
		b.stop()
		b.cp.with(func() { b.cp.enrollToken, b.cp.spent = "second-token", false })
		b.start(b.cp.bootstrap())
		b.eventually("re-enrolled", 0, func() bool { return b.agent.Stats().Enrollments == 1 })
		b.reportsOf(1, 3)
		b.settleAfter(3)
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook ran %d times", n)
		}
		var due bool
		b.cp.with(func() { due = b.cp.dueLocked() })
		if due {
			t.Fatal("configuration still due after re-enrollment")
		}
	})

	t.Run("InterruptedApplyRunsOnceMoreThenFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		h.set("hold", true)
		b.start(b.cp.bootstrap())
		d := b.cp.configure("app/v1", map[string]any{"a": 1})
		b.eventually("the hook to start", 0, func() bool { return len(h.runs()) == 1 })
		// The agent stops mid-hook (the hook is killed with it): the status
		// on disk says "applying", no report was made.
		b.stop()
		os.Remove(filepath.Join(h.dir, "running"))
		var st state.ConfigStatus
		state.ReadJSON(filepath.Join(b.dir, "config", "status.json"), &st)
		if st.State != state.ConfigApplying || st.Attempt != 1 || st.Revision != 1 {
			t.Fatalf("status %+v", st)
		}
		// Restart: the hook runs once more; interrupted again.
		b.start(nil)
		b.eventually("the hook to run again", 0, func() bool { return len(h.runs()) == 2 })
		b.stop()
		os.Remove(filepath.Join(h.dir, "running"))
		if n := len(b.cp.configReports(1)); n != 0 {
			t.Fatalf("%d reports before any outcome", n)
		}
		// Third start: not run a third time; reported failed, saying why.
		h.set("hold", false)
		b.start(nil)
		r := b.reportsOf(1, 1)
		if r[0].State != api.ConfigFailed || r[0].Hash != d.Hash || !strings.Contains(r[0].Message, "interrupted 2 times") {
			t.Fatalf("report %+v", r[0])
		}
		b.settleAfter(3)
		if n := len(h.runs()); n != 2 {
			t.Fatalf("hook ran %d times", n)
		}
		// A force runs it again, and it applies.
		b.cp.force()
		if r := b.reportsOf(1, 2); r[1].State != api.ConfigApplied {
			t.Fatalf("report %+v", r[1])
		}
	})

	t.Run("KilledBetweenWriteAndReportRerunsTheHookOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		// What kill -9 leaves after the document was written and while the
		// hook ran: the marker, the file and its meta, no outcome.
		st, err := state.Open(b.dir, state.Options{LockWait: lockWait})
		if err != nil {
			t.Fatal(err)
		}
		d := api.ConfigDelivery{Revision: 7, Hash: "h7", Format: "app/v1", Document: json.RawMessage(`{"a":7}`)}
		if err := st.SetConfigStatus(state.ConfigStatus{Revision: 7, Hash: "h7", Format: "app/v1", State: state.ConfigApplying, Attempt: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.WriteConfig(d); err != nil {
			t.Fatal(err)
		}
		st.Close()
		b.cp.with(func() { b.cp.cfgDesired = &d })
		b.start(b.cp.bootstrap())
		r := b.reportsOf(7, 1)
		if r[0].State != api.ConfigApplied || r[0].Hash != "h7" {
			t.Fatalf("report %+v", r[0])
		}
		b.settleAfter(3)
		if runs := h.runs(); len(runs) != 1 || !strings.HasPrefix(runs[0], "7 h7 app/v1 [extra] [") {
			t.Fatalf("hook runs %q", runs)
		}
		if !jsonEqual([]byte(h.seen(7)), d.Document) {
			t.Fatalf("hook saw %q", h.seen(7))
		}
	})

	t.Run("LowerRevisionIgnored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		d2 := b.cp.configure("app/v1", map[string]any{"a": 2})
		b.reportsOf(2, 1)
		old := api.ConfigDelivery{Revision: 1, Hash: "stale", Format: "app/v1", Document: json.RawMessage(`{"a":1}`)}
		b.cp.script(func(w http.ResponseWriter) {
			writeJSON(w, api.CommandsResponse{Commands: []api.Command{}, Config: &old})
		})
		b.settleAfter(3) // the scripted answer was taken
		for _, run := range h.runs() {
			if strings.HasPrefix(run, "1 stale") {
				t.Fatalf("stale revision applied: %q", h.runs())
			}
		}
		var meta state.ConfigMeta
		state.ReadJSON(filepath.Join(b.dir, "config", "current.meta.json"), &meta)
		if meta.Revision != 2 || meta.Hash != d2.Hash {
			t.Fatalf("meta %+v", meta)
		}
		for _, r := range b.cp.configReports(1) {
			if r.Hash == "stale" {
				t.Fatalf("stale revision reported: %+v", r)
			}
		}
	})

	t.Run("SlowHookBlocksNothingAndNewerRevisionAppliesAfter", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h := withHook(b)
		h.set("hold", true)
		b.hookTimeout = 24 * time.Hour // fake time runs on for the heartbeat
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.eventually("the hook to start", 0, func() bool { return len(h.runs()) == 1 })
		// Two newer revisions while it holds: the newest waits its turn.
		b.cp.configure("app/v1", map[string]any{"a": 2})
		b.settleAfter(2)
		d3 := b.cp.configure("app/v1", map[string]any{"a": 3})
		b.settleAfter(2)
		// Commands, heartbeats and renewals go on meanwhile.
		b.cp.push(launch("op-1", "run-1", "a1", "true"))
		b.eventually("the command applied", 0, func() bool { return len(b.cp.resultsFor("op-1")) > 0 })
		hb := len(b.cp.heartbeats())
		b.eventually("a heartbeat", 30*time.Second, func() bool { return len(b.cp.heartbeats()) > hb })
		if n := len(h.runs()); n != 1 {
			t.Fatalf("hook runs while holding: %q", h.runs())
		}
		h.set("hold", false)
		r := b.reportsOf(3, 1)
		if r[0].State != api.ConfigApplied || r[0].Hash != d3.Hash {
			t.Fatalf("report %+v", r[0])
		}
		runs := h.runs()
		if len(runs) != 2 || !strings.HasPrefix(runs[0], "1 ") || !strings.HasPrefix(runs[1], "3 ") {
			t.Fatalf("hook runs %q", runs)
		}
		if len(b.cp.configReports(2)) != 0 {
			t.Fatal("superseded revision 2 reported")
		}
		// In order: revision 1's outcome before revision 3's.
		var order []int64
		b.cp.with(func() {
			for _, e := range b.cp.cfgReports {
				order = append(order, e.Config.Revision)
			}
		})
		if !slices.Equal(order, []int64{1, 3}) {
			t.Fatalf("reports in order %v", order)
		}
	})

	t.Run("ReportOwedWhileTheSpoolIsFullNeverDropped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A spool full of workload events the server has not taken.
		st, err := state.Open(b.dir, state.Options{LockWait: lockWait})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"wl-1", "wl-2", "wl-3"} {
			st.AppendEvent(api.Event{ID: id, Kind: api.EventWorkload, ObservedAt: b.clk.Now(),
				Workload: &api.WorkloadObservation{RunID: "r", AttemptID: id, State: api.WorkloadCreated, ObservedAt: b.clk.Now()}})
		}
		st.Close()
		b.maxEvents = 3
		b.cp.with(func() { b.cp.eventsDown = 1 << 30 })
		b.start(b.cp.bootstrap())
		b.cp.configure("app/v1", map[string]any{"a": 1})
		b.eventually("applied", 0, func() bool {
			st, ok := b.agent.ConfigStatus()
			return ok && st.State == api.ConfigApplied
		})
		b.settleAfter(2) // deliveries go on: the report could not be spooled
		for _, e := range b.store.PendingEvents(10) {
			if e.Kind == api.EventConfig {
				t.Fatal("spooled past the cap")
			}
		}
		// The server takes events again; the spool drains and the next
		// delivery spools the owed report.
		b.cp.with(func() { b.cp.eventsDown = 0 })
		b.eventually("the report", time.Second, func() bool { return len(b.cp.configReports(1)) == 1 })
		if r := b.cp.configReports(1)[0]; r.State != api.ConfigApplied {
			t.Fatalf("report %+v", r)
		}
		if n := b.agent.Stats().ConfigApplies; n != 1 {
			t.Fatalf("applied %d times", n)
		}
	})

	t.Run("CapabilitiesInFacts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.start(b.cp.bootstrap())
		b.eventually("a heartbeat", 0, func() bool { return len(b.cp.heartbeats()) > 0 })
		want := []string{api.CapCommands, api.CapConfig, api.CapOutput, api.CapDiag}
		var enrolled []string
		b.cp.with(func() { enrolled = b.cp.enrolls[0].Facts.Capabilities })
		if !slices.Equal(enrolled, want) {
			t.Fatalf("enrollment capabilities %v", enrolled)
		}
		if got := b.cp.heartbeats()[0].Facts.Capabilities; !slices.Equal(got, want) {
			t.Fatalf("heartbeat capabilities %v", got)
		}
	})
}

func TestConfigHookEnvironment(t *testing.T) {
	t.Setenv("NODEWARD_AGENT_BOOTSTRAP", `{"enrollment_token":"secret"}`)
	t.Setenv("NODEWARD_CONFIG_REVISION", "99")
	env := hookEnv(api.ConfigDelivery{Revision: 4, Hash: "abc", Format: "f/v1"}, "apply-1")
	for _, kv := range env {
		if strings.HasPrefix(kv, "NODEWARD_AGENT_") {
			t.Fatalf("agent setting leaked to the hook: %s", kv)
		}
	}
	for _, want := range []string{"NODEWARD_CONFIG_REVISION=4", "NODEWARD_CONFIG_HASH=abc", "NODEWARD_CONFIG_FORMAT=f/v1", "NODEWARD_CONFIG_APPLY_ID=apply-1"} {
		if !slices.Contains(env, want) {
			t.Fatalf("%s missing from %q", want, env)
		}
	}
	if slices.Contains(env, "NODEWARD_CONFIG_REVISION=99") {
		t.Fatal("inherited revision kept")
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 6} // cuts inside the ö
	tb.Write([]byte("hello "))
	tb.Write([]byte("wörld!!"))
	if got := tb.String(); got != "…rld!!" {
		t.Fatalf("%q", got)
	}
	short := &tailBuffer{max: 64}
	short.Write([]byte("ok\n"))
	if got := short.String(); got != "ok" {
		t.Fatalf("%q", got)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
