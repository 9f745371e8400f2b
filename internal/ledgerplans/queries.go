package ledgerplans

import (
	"context"
	"fmt"
	"time"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
)

// Query is one statement to explain.
type Query struct {
	// Name says what runs it (a listing filter, or a store method).
	Name string
	// Selective queries match few rows whatever the table's size; at
	// small scale only they are sure to be planned without a sequential
	// scan (the planner rightly reads a 20,000-row table whole to find
	// rows one in ten matches).
	Selective bool
	models.Statement
}

// listLimit is the listing's default page (DECISIONS.md §40).
const listLimit = 100

// Queries answers every statement to explain over a ledger seeded at sc:
// each listing filter alone, then combined, each with and without a
// cursor (before: the middle of the table), then the ledger's hot
// statements. Filter values are ones the seed wrote, read back from db.
func Queries(ctx context.Context, db *models.DB, st models.LedgerStatements, sc Scale) ([]Query, error) {
	n := sc.Operations
	mid := int64(n / 2)
	_, host := principalID(admins + 3)
	admin := ledger.Principal{Kind: ledger.PrincipalAdmin, ID: "usr_01"}
	// A request id of the host's, and the principal and request id of an
	// operation, older than the cursor so both pages find them.
	var hostRequest string
	var byReq ledger.Principal
	var byReqID string
	err := db.WithContext(ctx).Raw(`SELECT request_id FROM operations WHERE principal_id = ? AND seq < ? ORDER BY seq DESC LIMIT 1`,
		host, mid).Row().Scan(&hostRequest)
	if err == nil {
		err = db.WithContext(ctx).Raw(`SELECT principal_kind, principal_id, request_id FROM operations WHERE seq = ?`, n/3).
			Row().Scan(&byReq.Kind, &byReq.ID, &byReqID)
	}
	if err != nil {
		return nil, fmt.Errorf("sample filter values: %w", err)
	}
	parent := opID((n/2/fanEvery)*fanEvery - fanEvery) // its children are older than mid
	node := "nod_000042"
	type filter struct {
		name      string
		selective bool
		f         ledger.Filter
	}
	filters := []filter{
		{"package_host_id", true, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: host}},
		{"family (common: commands)", false, ledger.Filter{Family: ledger.FamilyCommands}},
		{"family (rare: fleet)", true, ledger.Filter{Family: ledger.FamilyFleet}},
		{"kind (common: node.launch_workload)", false, ledger.Filter{Kind: ledger.KindNodeLaunchWorkload}},
		{"kind (rare: fleet.command)", true, ledger.Filter{Kind: ledger.KindFleetCommand}},
		{"state (open: pending)", true, ledger.Filter{State: ledger.StatePending}},
		{"state (open: running)", true, ledger.Filter{State: ledger.StateRunning}},
		{"state (ended: failed)", false, ledger.Filter{State: ledger.StateFailed}},
		{"request_id", true, ledger.Filter{RequestID: byReqID}},
		{"operation_id", true, ledger.Filter{OperationID: opID(n / 3)}},
		{"parent", true, ledger.Filter{ParentID: parent}},
		{"target_kind (common: node)", false, ledger.Filter{TargetKind: ledger.TargetNode}},
		{"target_kind (rare: fleet)", true, ledger.Filter{TargetKind: ledger.TargetFleet}},
		{"target_id", true, ledger.Filter{TargetID: node}},
		{"target_kind + target_id", true, ledger.Filter{TargetKind: ledger.TargetNode, TargetID: node}},
		{"package_host_id + state", true, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: host, State: ledger.StateFailed}},
		{"package_host_id + kind", true, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: host, Kind: ledger.KindNodeRetire}},
		// Package hosts never run admin-only kinds: both filters common,
		// together matching nothing, the planner's worst case.
		{"package_host_id + kind (admin-only: none match)", true, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: host, Kind: ledger.KindCredentialIssue}},
		{"family + state", false, ledger.Filter{Family: ledger.FamilyNodes, State: ledger.StatePending}},
		{"kind + target_id", true, ledger.Filter{Kind: ledger.KindNodeStopWorkload, TargetKind: ledger.TargetNode, TargetID: node}},
		{"package_host_id + request_id", true, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: host, RequestID: hostRequest}},
		{"parent + state", true, ledger.Filter{ParentID: parent, State: ledger.StateSucceeded}},
		{"no filter", false, ledger.Filter{}},
	}
	var out []Query
	reg := servedRegistry()
	for _, f := range filters {
		// As ledger.Service.List hands the filter to the store.
		f.f = reg.Narrow(f.f)
		f.f.Limit = listLimit
		out = append(out, Query{Name: "list: " + f.name, Selective: f.selective, Statement: st.List(f.f)})
		f.f.Before = mid
		out = append(out, Query{Name: "list: " + f.name + ", before", Selective: f.selective, Statement: st.List(f.f)})
	}
	now := time.Now()
	// The dispatcher's and the sweepers' batch sizes.
	const batch = 100
	return append(out,
		Query{"Claim (its subquery)", true, st.ClaimQueue(batch)},
		Query{"CountOpenForNode", true, st.CountOpenForNode(node, nil)},
		Query{"CountOpenForNode (except node.retire)", true, st.CountOpenForNode(node, []string{ledger.KindNodeRetire})},
		Query{"CountOpenForPrincipal", true, st.CountOpenForPrincipal(admin)},
		Query{"Orphans", true, st.Orphans("replica-b", now, batch)},
		Query{"Overdue", true, st.Overdue(now, batch)},
		Query{"FanningOut", true, st.FanningOut(batch)},
		// Retention: operations kept 90 days, events 7 (DECISIONS.md §41).
		Query{"Prune (operations)", true, st.PruneOperations(now.Add(-90*24*time.Hour), 500)},
		Query{"Prune (events)", true, st.PruneEvents(now.Add(-7*24*time.Hour), 500)},
		Query{"Prune (shared operations)", true, st.PruneBodies(now.Add(-90*24*time.Hour), 500)},
		Query{"Prune (shared configuration documents)", true, st.PruneConfigDocuments(500)},
		Query{"OperationByRequest", true, st.OperationByRequest(byReq, byReqID)},
		Query{"Events", true, st.Events(opID(n/3), 0, 500)},
		Query{"ChildCounts", true, st.ChildCounts(parent)},
		Query{"CountOpen", true, st.CountOpen()},
		// The console's fleet overview (last hour by state, failed in a day).
		Query{"Summarize", true, st.Summarize(now.Add(-time.Hour), now.Add(-24*time.Hour))},
		// Desired configuration (DECISIONS.md §32): a poll's read, a
		// delivery's and a report's writes to the node's configure
		// operations, the lagging listing and its count.
		Query{"DueWork", true, st.DueWork(fleet.Due{NodeID: node, Fencing: 1, RedeliverBefore: now.Add(-time.Minute)})},
		Query{"ConfiguresRunning", true, st.ConfiguresRunning(node, now)},
		Query{"OpenConfigures", true, st.OpenConfigures(node)},
		Query{"LaggingConfigs", true, st.LaggingConfigs("", listLimit+1)},
		Query{"LaggingConfigs, before", true, st.LaggingConfigs("nod_000500", listLimit+1)},
		Query{"CountConfigs", true, st.CountConfigs()},
	), nil
}
