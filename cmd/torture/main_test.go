package main

import (
	"strings"
	"testing"

	"github.com/nodeward/nodeward/e2e"
)

// TestReportRendersConfigFigures: a desired-configuration fault test's
// figures get a table of their own (revisions, hook runs, re-runs,
// convergence), not a row of the commands table.
func TestReportRendersConfigFigures(t *testing.T) {
	r := report{Cycles: 2, Figures: []e2e.Figures{
		{Fault: "agent kill -9", Cycles: 2, Issued: 10, Applied: 10, RecoveryMS: []int64{100, 300}},
		{Fault: "config faults", Cycles: 2, RecoveryMS: []int64{1000, 4000, 2000},
			Config: &e2e.ConfigFigures{Nodes: 4, NodeConfigures: 83, FleetConfigures: 3, Revisions: 95, HookRuns: 94, ReRuns: 2, HooksKilled: 1}},
	}}
	md := r.markdown()
	for _, want := range []string{
		"### Desired configuration under faults",
		"| config faults | 2 | 4 | 95 | 94 | 2 | 0 | 0 | 0 | 1 | 0 | 2s | 4s |",
		"83 `node.configure`, 3 `fleet.configure`",
		"Desired configuration: 95 revisions written under faults, 0 applied out of order.",
		"recovery median 300ms, max 300ms", // convergence times stay out of the commands' recovery
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| config faults | 2 | 0 |") {
		t.Errorf("the config test has a row in the commands table:\n%s", md)
	}
}
