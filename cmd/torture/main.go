// Command torture runs Nodeward's fault and attack suites at full size and
// writes what happened as docs/reliability.md: the figures a skeptical
// operator asks for before trusting "a command is never lost and never
// applied twice; nobody gets in uninvited".
//
//	go run ./cmd/torture -cycles 50 -database-url "$PG_URL" -out docs/reliability.md
//
// The work is in the ordinary Go tests — the fault suite in e2e
// (TestTorture*: real server and agent processes on loopback, kill -9,
// replica failover behind a TCP proxy, a private Postgres cluster crashed
// and restarted), the attack tests in handlers, auth and keys, the fuzz
// targets — which CI runs at their small size. This driver runs them with
// more cycles, collects the figures they append to files it names
// (NODEWARD_TORTURE_OUT, NODEWARD_TORTURE_TALLY), fuzzes every target for a
// while, and renders the report; the tests themselves never write into the
// tree (DECISIONS.md §27). It exits non-zero when any test failed, after
// writing the report that says so.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nodeward/nodeward/e2e"
	"github.com/nodeward/nodeward/internal/tally"
)

// attackRun selects the attack tests whose refusals the report counts.
const attackRun = `^(TestTokenForgery|TestConsoleSessionFixationAndBruteForce|TestHostileRequests|TestPinnedAudienceTypeAndAlgorithm|TestFamiliesDoNotCrossVerify|TestExpiryWithLeeway|TestLoginRefusals|TestLoginLimiter)$`

func main() {
	cycles := flag.Int("cycles", 50, "fault cycles per fault test")
	dbURL := flag.String("database-url", os.Getenv("NODEWARD_TEST_DATABASE_URL"), "PostgreSQL URL of the shared test server (replica tests create a private database on it); empty skips them")
	out := flag.String("out", "", "write the markdown report here (default: standard output)")
	fuzztime := flag.Duration("fuzztime", 10*time.Second, "fuzzing time per fuzz target (0 skips fuzzing)")
	timeout := flag.Duration("timeout", 60*time.Minute, "bound on the fault suite")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "nodeward-torture-")
	check(err)
	defer os.RemoveAll(tmp)
	figuresFile := filepath.Join(tmp, "figures.jsonl")
	tallyFile := filepath.Join(tmp, "tally.jsonl")
	env := append(os.Environ(),
		e2e.EnvTortureCycles+"="+strconv.Itoa(*cycles),
		e2e.EnvTortureOut+"="+figuresFile,
		tally.EnvFile+"="+tallyFile,
	)
	if *dbURL != "" {
		env = append(env, "NODEWARD_TEST_DATABASE_URL="+*dbURL)
	}
	r := report{Started: time.Now().UTC(), Cycles: *cycles, CPUs: runtime.NumCPU(), Commit: gitCommit()}

	step("fault suite", "%d cycles per test", *cycles)
	r.Faults = goTest(env, "-count=1", "-parallel=1", "-timeout="+timeout.String(), "-run=^TestTorture", "./e2e")
	step("attack suite", "")
	r.Attacks = goTest(env, "-count=1", "-run="+attackRun, "./handlers", "./auth", "./keys")
	if *fuzztime > 0 {
		for _, t := range fuzzTargets() {
			step("fuzz", "%s %s for %s", t.pkg, t.name, *fuzztime)
			t.execs, t.ok = fuzz(t.pkg, t.name, *fuzztime)
			r.Fuzz = append(r.Fuzz, t)
		}
	}
	r.Figures = readFigures(figuresFile)
	r.Tally = readTally(tallyFile)
	r.Took = time.Since(r.Started).Round(time.Second)

	md := r.markdown()
	if *out == "" {
		fmt.Print(md)
	} else {
		check(os.WriteFile(*out, []byte(md), 0o644))
		fmt.Fprintf(os.Stderr, "torture: wrote %s\n", *out)
	}
	if !r.passed() {
		fmt.Fprintln(os.Stderr, "torture: FAILED (see the report)")
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "torture:", err)
		os.Exit(2)
	}
}

func step(what, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "torture: %s %s\n", what, fmt.Sprintf(format, args...))
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// testResult is one top-level test's outcome.
type testResult struct {
	Package, Test, Action string
	Elapsed               float64
	output                []string
}

// goTest runs go test -json and answers each top-level test's outcome,
// echoing the output of failed tests to stderr.
func goTest(env []string, args ...string) []testResult {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	check(err)
	check(cmd.Start())
	byName := map[string]*testResult{}
	var order []string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	for sc.Scan() {
		var ev struct {
			Action, Package, Test, Output string
			Elapsed                       float64
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" || strings.Contains(ev.Test, "/") {
			continue
		}
		key := ev.Package + " " + ev.Test
		tr := byName[key]
		if tr == nil {
			tr = &testResult{Package: ev.Package, Test: ev.Test}
			byName[key] = tr
			order = append(order, key)
		}
		switch ev.Action {
		case "output":
			if len(tr.output) < 4000 {
				tr.output = append(tr.output, ev.Output)
			}
		case "pass", "fail", "skip":
			tr.Action, tr.Elapsed = ev.Action, ev.Elapsed
			fmt.Fprintf(os.Stderr, "torture:   %s %s (%.0fs)\n", ev.Action, ev.Test, ev.Elapsed)
			if ev.Action == "fail" {
				fmt.Fprint(os.Stderr, strings.Join(tr.output, ""))
			}
		}
	}
	err = cmd.Wait()
	var res []testResult
	for _, k := range order {
		tr := *byName[k]
		if tr.Action == "" {
			tr.Action = "fail" // never finished: a timeout or a crash
		}
		res = append(res, tr)
	}
	if err != nil && len(res) == 0 {
		res = append(res, testResult{Package: strings.Join(args, " "), Test: "(go test)", Action: "fail"})
	}
	return res
}

// fuzzTarget is one fuzz function and how much of it ran.
type fuzzTarget struct {
	pkg, name string
	execs     int64
	ok        bool
}

var pkgLine = regexp.MustCompile(`^ok\s+(\S+)`)

// fuzzTargets lists every fuzz target of the module, with its package.
func fuzzTargets() []fuzzTarget {
	out, err := exec.Command("go", "test", "-list", "^Fuzz", "./...").Output()
	check(err)
	var pending []string
	var targets []fuzzTarget
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "Fuzz"):
			pending = append(pending, strings.TrimSpace(line))
		case pkgLine.MatchString(line):
			pkg := pkgLine.FindStringSubmatch(line)[1]
			for _, name := range pending {
				targets = append(targets, fuzzTarget{pkg: pkg, name: name})
			}
			pending = nil
		}
	}
	return targets
}

var execsRe = regexp.MustCompile(`execs: (\d+)`)

// fuzz runs one target for d and answers how many inputs it tried.
func fuzz(pkg, name string, d time.Duration) (int64, bool) {
	cmd := exec.Command("go", "test", "-run=^$", "-fuzz=^"+name+"$", "-fuzztime="+d.String(), "-parallel=1", pkg)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	var execs int64
	for _, m := range execsRe.FindAllStringSubmatch(buf.String(), -1) {
		if n, _ := strconv.ParseInt(m[1], 10, 64); n > execs {
			execs = n
		}
	}
	if err != nil {
		fmt.Fprint(os.Stderr, buf.String())
	}
	return execs, err == nil
}

func readFigures(path string) []e2e.Figures {
	var out []e2e.Figures
	eachLine(path, func(b []byte) {
		var f e2e.Figures
		if json.Unmarshal(b, &f) == nil {
			out = append(out, f)
		}
	})
	return out
}

func readTally(path string) []tally.Entry {
	var out []tally.Entry
	eachLine(path, func(b []byte) {
		var e tally.Entry
		if json.Unmarshal(b, &e) == nil {
			out = append(out, e)
		}
	})
	return out
}

func eachLine(path string, fn func([]byte)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fn(sc.Bytes())
	}
}

type report struct {
	Started time.Time
	Took    time.Duration
	Cycles  int
	CPUs    int
	Commit  string
	Faults  []testResult
	Attacks []testResult
	Fuzz    []fuzzTarget
	Figures []e2e.Figures
	Tally   []tally.Entry
}

func (r report) passed() bool {
	for _, t := range append(append([]testResult(nil), r.Faults...), r.Attacks...) {
		if t.Action == "fail" {
			return false
		}
	}
	for _, f := range r.Fuzz {
		if !f.ok {
			return false
		}
	}
	return true
}

func (r report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Reliability: the fault and attack suites\n\n")
	w("Generated by `make torture` (`go run ./cmd/torture`); do not edit by hand.\n")
	w("Run %s at commit `%s` on %d CPUs, %d fault cycles per test, in %s. Result: **%s**.\n\n",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Commit, r.CPUs, r.Cycles, r.Took, map[bool]string{true: "all passed", false: "FAILURES (below)"}[r.passed()])
	w("The promise under test: a command is never lost and never applied twice, across control-plane kill -9, agent kill -9, replica failover and Postgres restarts; a superseded agent is fenced; every node converges on its last desired configuration, never applying one out of order; nobody gets in uninvited. Everything runs as real processes on loopback (`e2e/`); the small version of every test runs in CI.\n\n")

	var sumIssued, sumApplied, sumDup, sumLost, sumCycles, sumRevisions, sumOutOfOrder int
	var allRecovery []int64
	for _, f := range r.Figures {
		sumIssued, sumApplied, sumDup, sumLost, sumCycles = sumIssued+f.Issued, sumApplied+f.Applied, sumDup+f.Duplicated, sumLost+f.Lost, sumCycles+f.Cycles
		if f.Config != nil {
			// Convergence, not a command's recovery: in its own table.
			sumRevisions, sumOutOfOrder = sumRevisions+f.Config.Revisions, sumOutOfOrder+f.Config.OutOfOrder
			continue
		}
		allRecovery = append(allRecovery, f.RecoveryMS...)
	}
	var fuzzed int64
	for _, f := range r.Fuzz {
		fuzzed += f.execs
	}
	med, max := e2e.MedianMax(allRecovery)
	w("**In short:** %d fault cycles; %d commands issued, %d applied, %d duplicated, %d lost; recovery median %s, max %s; %d attack inputs and %d fuzz inputs tried.\n\n",
		sumCycles, sumIssued, sumApplied, sumDup, sumLost, dur(med, len(allRecovery)), dur(max, len(allRecovery)), len(r.Tally), fuzzed)
	if sumRevisions > 0 {
		w("Desired configuration: %d revisions written under faults, %d applied out of order.\n\n", sumRevisions, sumOutOfOrder)
	}

	w("## Faults\n\n")
	w("| fault | cycles | issued | applied | duplicated | lost | pending | recovery median | recovery max |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var issued, applied, dup, lost, cyc int
	var checks []e2e.Figures  // figures without commands: the secrets greps
	var configs []e2e.Figures // desired configuration: revisions, not commands
	for _, f := range r.Figures {
		if f.Config != nil {
			configs = append(configs, f)
			continue
		}
		if f.Cycles == 0 {
			checks = append(checks, f)
			continue
		}
		med, max := e2e.MedianMax(f.RecoveryMS)
		w("| %s | %d | %d | %d | %d | %d | %d | %s | %s |\n", f.Fault, f.Cycles, f.Issued, f.Applied, f.Duplicated, f.Lost, f.Pending, dur(med, len(f.RecoveryMS)), dur(max, len(f.RecoveryMS)))
		issued, applied, dup, lost, cyc = issued+f.Issued, applied+f.Applied, dup+f.Duplicated, lost+f.Lost, cyc+f.Cycles
	}
	w("| **all** | %d | %d | %d | %d | %d | | | |\n\n", cyc, issued, applied, dup, lost)
	w("Recovery is the time from the fault (for Postgres: from the database accepting connections again) until a command issued after it was applied by its node. *Applied* counts commands the server settled as applied, whose ledger operation succeeded, whose agent journal holds the done record, and whose effect happened exactly once on the node (agents' launch records, or marker files the workloads append to).\n\n")
	for _, f := range r.Figures {
		if f.Cycles == 0 || len(f.Codes) == 0 && len(f.Notes) == 0 {
			continue
		}
		w("- **%s**", f.Fault)
		if len(f.Codes) > 0 {
			w(" — answers during the faults: %s", counts(f.Codes))
		}
		for _, n := range f.Notes {
			w("; %s", n)
		}
		w("\n")
	}
	w("\n")
	if len(configs) > 0 {
		configTable(&b, configs)
	}
	if len(checks) > 0 {
		w("### Secrets at rest\n\n")
		for _, f := range checks {
			w("- **%s**: %s\n", f.Fault, strings.Join(f.Notes, "; "))
		}
		w("\n")
	}
	w("### Fault tests\n\n")
	testTable(&b, r.Faults)

	w("## Attacks\n\n")
	bySuite := map[string]int{}
	byCode := map[string]int{}
	for _, e := range r.Tally {
		bySuite[e.Suite]++
		code := e.Code
		if code == "" {
			code = "(page)"
		}
		byCode[fmt.Sprintf("%d %s", e.Status, code)]++
	}
	w("Inputs tried by the attack tests: **%d** (%s).\n\n", len(r.Tally), counts(bySuite))
	w("| answer | count |\n| --- | ---: |\n")
	for _, k := range sortedKeys(byCode) {
		w("| %s | %d |\n", k, byCode[k])
	}
	w("\nEvery forged or misused credential — alg `none`, HS256 with a guessed key or another credential family's key, RS256, an HS256 token keyed with a public key, wrong `typ` or audience, expired, not yet valid, issued in the future, without expiry, another node's session, a superseded fencing token, a replayed or superseded enrollment token, the reinvite race — is refused at every agent door, the admin API and the console, and no token tried appears in the server's log (`handlers/forgery_test.go`).\n\n")
	w("### Attack tests\n\n")
	testTable(&b, r.Attacks)

	if len(r.Fuzz) > 0 {
		w("## Fuzzing\n\n| package | target | inputs tried | result |\n| --- | --- | ---: | --- |\n")
		var total int64
		for _, f := range r.Fuzz {
			total += f.execs
			w("| %s | %s | %d | %s |\n", f.pkg, f.name, f.execs, map[bool]string{true: "ok", false: "**FAILED**"}[f.ok])
		}
		w("| | **all** | **%d** | |\n\n", total)
	}
	return b.String()
}

// configTable renders the desired-configuration fault tests: their unit is
// a revision, and their promise is convergence in order.
func configTable(b io.Writer, fs []e2e.Figures) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### Desired configuration under faults\n\n")
	w("| fault | cycles | nodes | revisions written | hook runs | re-runs after kills | given up | out of order | overlapping runs | left-over hooks killed | lagging after | convergence median | convergence max |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, f := range fs {
		c := f.Config
		med, max := e2e.MedianMax(f.RecoveryMS)
		w("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", f.Fault, f.Cycles, c.Nodes, c.Revisions, c.HookRuns, c.ReRuns, c.GaveUp, c.OutOfOrder, c.Overlaps, c.HooksKilled, c.Lagging,
			dur(med, len(f.RecoveryMS)), dur(max, len(f.RecoveryMS)))
	}
	w("\n*Revisions written* counts every node's revisions (each `node.configure` of the stream and each node's share of a `fleet.configure`); nodes skip revisions superseded before they polled (delivery is level-triggered), so hook runs can be fewer. *Re-runs after kills*: applies a kill interrupted, run once more at restart (DECISIONS.md §32 allows one); *given up*: applies interrupted twice, reported failed instead of a third run. *Out of order*: a hook run of an older revision after a newer one; *overlapping runs*: a hook run started while another was still going; *left-over hooks killed*: hooks a kill -9 of the agent left running (their process group survives it, and the unit's `KillMode=process` keeps it), killed by the restarted agent before it applied again. Convergence is the time from a kill until every node applied the revision desired for it when the fault was over. Afterwards, once every `fleet.configure` had ended, each node's revision was exactly its `node.configure` operations plus the `fleet.configure` children the ledger says recorded a revision for it (succeeded, or superseded after recording); every node applied its last revision, its hook's last run was that revision, and the lagging count (API and gauge) was 0; it was exactly 1 with one node stopped behind a `fleet.configure`.\n\n")
	for _, f := range fs {
		c := f.Config
		w("- **%s** — %d `node.configure`, %d `fleet.configure`", f.Fault, c.NodeConfigures, c.FleetConfigures)
		if len(f.Codes) > 0 {
			w("; answers during the faults: %s", counts(f.Codes))
		}
		for _, n := range f.Notes {
			w("; %s", n)
		}
		w("\n")
	}
	w("\n")
}

func testTable(b io.Writer, ts []testResult) {
	fmt.Fprintf(b, "| test | result | seconds |\n| --- | --- | ---: |\n")
	for _, t := range ts {
		res := t.Action
		if res == "fail" {
			res = "**FAILED**"
		}
		fmt.Fprintf(b, "| %s `%s` | %s | %.0f |\n", strings.TrimPrefix(t.Package, "github.com/nodeward/nodeward/"), t.Test, res, t.Elapsed)
	}
	fmt.Fprintln(b)
}

func dur(d time.Duration, n int) string {
	if n == 0 {
		return "–"
	}
	return d.Round(time.Millisecond).String()
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s × %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
