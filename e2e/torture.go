package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The fault suite ("torture") runs from `go test` in a small version and
// from `make torture` (cmd/torture) in the full one. These knobs and the
// figures file are its only link to the driver: the tests never write into
// the tree (DECISIONS §27); cmd/torture renders docs/reliability.md from
// the figures they append to NODEWARD_TORTURE_OUT.
const (
	// EnvTortureCycles overrides the number of fault cycles per test.
	EnvTortureCycles = "NODEWARD_TORTURE_CYCLES"
	// EnvTortureOut names a file the fault tests append their figures to,
	// one JSON object a line.
	EnvTortureOut = "NODEWARD_TORTURE_OUT"
)

// TortureCycles answers the cycles a fault test runs: def (the CI size)
// unless NODEWARD_TORTURE_CYCLES says otherwise.
func TortureCycles(def int) int {
	if n, err := strconv.Atoi(os.Getenv(EnvTortureCycles)); err == nil && n > 0 {
		return n
	}
	return def
}

// Desired configuration under faults (torture_config_test.go) plugs into
// the same pieces: its own stream of configure operations, the same
// kill/restart steps, and Figures with Config set, which cmd/torture
// renders in a table of its own.

// Figures are one fault test's outcome, as the reliability report shows it.
type Figures struct {
	Fault      string  `json:"fault"`
	Cycles     int     `json:"cycles"`
	Issued     int     `json:"issued"`
	Applied    int     `json:"applied"`
	Duplicated int     `json:"duplicated"`
	Lost       int     `json:"lost"`
	Pending    int     `json:"pending"`
	Refused    int     `json:"refused"`
	RecoveryMS []int64 `json:"recovery_ms"`
	// Codes counts answers by problem code (refusals the fault provoked,
	// e.g. fenced, unavailable).
	Codes map[string]int `json:"codes,omitempty"`
	Notes []string       `json:"notes,omitempty"`
	// Config is set by the desired-configuration fault tests, whose unit
	// is a revision, not a command: Issued..Refused stay 0 and RecoveryMS
	// is the convergence time (from the fault until every node applied
	// the revision desired for it when the fault was over).
	Config *ConfigFigures `json:"config,omitempty"`
}

// ConfigFigures are a desired-configuration fault test's outcome.
type ConfigFigures struct {
	Nodes           int `json:"nodes"`
	NodeConfigures  int `json:"node_configures"`  // node.configure operations accepted
	FleetConfigures int `json:"fleet_configures"` // fleet.configure operations accepted
	Revisions       int `json:"revisions"`        // revisions written, over all nodes
	HookRuns        int `json:"hook_runs"`        // runs of the apply hook, over all nodes
	// ReRuns counts revisions whose hook ran again at restart because a
	// kill interrupted the apply (DECISIONS §32 allows one).
	ReRuns int `json:"re_runs"`
	// GaveUp counts applies interrupted twice, reported failed instead
	// of a third run.
	GaveUp     int `json:"gave_up"`
	OutOfOrder int `json:"out_of_order"` // hook runs of an older revision after a newer one
	// Overlaps counts hook runs that started while another was still
	// running: a run orphaned by killing its agent (the hook has its own
	// process group) and the one resumed at restart.
	Overlaps int `json:"overlaps"`
	// HooksKilled counts hooks a kill left running that the restarted
	// agent killed before applying again.
	HooksKilled int `json:"hooks_killed"`
	Lagging     int `json:"lagging"` // the lagging count at the end
}

// Recovered adds one recovery time.
func (f *Figures) Recovered(d time.Duration) { f.RecoveryMS = append(f.RecoveryMS, d.Milliseconds()) }

// MedianMax answers the median and maximum recovery time.
func MedianMax(ms []int64) (median, max time.Duration) {
	if len(ms) == 0 {
		return 0, 0
	}
	s := append([]int64(nil), ms...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return time.Duration(s[len(s)/2]) * time.Millisecond, time.Duration(s[len(s)-1]) * time.Millisecond
}

var figuresMu sync.Mutex

// Report logs the figures and appends them to NODEWARD_TORTURE_OUT when set.
func (f *Figures) Report(t testing.TB) {
	t.Helper()
	med, max := MedianMax(f.RecoveryMS)
	t.Logf("%s: %d cycles, issued %d, applied %d, duplicated %d, lost %d, pending %d, refused %d, recovery median %s max %s, codes %v",
		f.Fault, f.Cycles, f.Issued, f.Applied, f.Duplicated, f.Lost, f.Pending, f.Refused, med, max, f.Codes)
	if c := f.Config; c != nil {
		t.Logf("%s: %d nodes, %d node.configure, %d fleet.configure, %d revisions, %d hook runs, %d re-runs after kills, %d given up, %d out of order, %d overlapping runs, %d left-over hooks killed at restart, %d lagging at the end, convergence median %s max %s",
			f.Fault, c.Nodes, c.NodeConfigures, c.FleetConfigures, c.Revisions, c.HookRuns, c.ReRuns, c.GaveUp, c.OutOfOrder, c.Overlaps, c.HooksKilled, c.Lagging, med, max)
	}
	for _, n := range f.Notes {
		t.Logf("%s: %s", f.Fault, n)
	}
	out := os.Getenv(EnvTortureOut)
	if out == "" {
		return
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	figuresMu.Lock()
	defer figuresMu.Unlock()
	file, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("torture figures: %v", err)
	}
	defer file.Close()
	if _, err := file.Write(append(b, '\n')); err != nil {
		t.Fatalf("torture figures: %v", err)
	}
}

// TryCall makes one request to base without failing the test: a transport
// error (a dead server) is an answer like any other here.
func TryCall(base, method, path string, body any, token string, header http.Header) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// ProblemCode answers the problem+json code of an answer ("" if none).
func ProblemCode(raw []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(raw, &p)
	return p.Code
}

// journalOp is the part of an agent's ops record the suite reads.
type journalOp struct {
	OperationID string `json:"operation_id"`
	State       string `json:"state"`
}

// readJournal answers the agent's record of one operation (ok false when
// the agent never recorded it).
func readJournal(stateDir, operationID string) (journalOp, bool, error) {
	sum := sha256.Sum256([]byte(operationID))
	raw, err := os.ReadFile(filepath.Join(stateDir, "ops", hex.EncodeToString(sum[:])+".json"))
	if os.IsNotExist(err) {
		return journalOp{}, false, nil
	}
	if err != nil {
		return journalOp{}, false, err
	}
	var op journalOp
	if err := json.Unmarshal(raw, &op); err != nil {
		return journalOp{}, false, fmt.Errorf("journal record of %s: %v", operationID, err)
	}
	return op, true, nil
}
