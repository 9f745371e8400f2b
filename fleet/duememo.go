package fleet

import "time"

// dueMemo remembers, per node, that this replica's last due-work read
// found the node quiet (DueWork.quiet: no pending command at all, no
// configuration due or riding), so a poll arriving again may skip the read
// (issue 13: an idle fleet's reads filled the machine at 50,000 agents).
//
// Quiet is a state only a write can end — a command issued or released,
// a configuration pushed, forced or made due by a report, an enrollment
// (a new fencing token) — and every such write notifies the node
// (NotifyCommands or NotifyNode) once it commits, which forgets its entry
// (memo, which also says how missed notifications, racing reads, age and
// the bound on entries are handled). Time alone ends quiet only through a
// delivered, unsettled command (the visibility timeout, DECISIONS.md §2)
// or a configuration delivered but not reported (§32), and a read that
// finds either is not kept. Nothing is kept while the notifier is down.
type dueMemo struct {
	// The value is the fencing token of the read that found the node
	// quiet; a read that did not is not kept.
	*memo[int64]
}

func newDueMemo(maxAge time.Duration, limit int, healthy bool, now func() time.Time) *dueMemo {
	return &dueMemo{newMemo[int64](maxAge, 0, limit, healthy, now)}
}

// quiet reports whether a read of node at fencing may be skipped: the last
// read found it quiet at that fencing token, and the memo may rely on it.
func (m *dueMemo) quiet(nodeID string, fencing int64) bool {
	f, ok := m.get(nodeID)
	return ok && f == fencing
}

// put records what the read begun with token found: kept only when quiet
// and no forget came since begin; otherwise the node's entry goes.
func (m *dueMemo) put(nodeID string, token uint64, fencing int64, quiet bool) {
	m.memo.put(nodeID, token, fencing, quiet)
}
