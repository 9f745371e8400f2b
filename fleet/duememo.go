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
	*memo[dueState]
}

// dueState is what the node's last read (or claim) found, at the fencing
// token it was made for: quiet, or awaiting — nothing due and no
// configuration due or riding, but commands delivered and not yet settled
// (which fall due again by time alone, so polls still read). A settlement
// that leaves the node no pending command turns awaiting into quiet
// (settled): no read needed to learn what the settlement just did.
type dueState struct {
	fencing  int64
	awaiting bool
}

func newDueMemo(maxAge time.Duration, limit int, healthy bool, now func() time.Time) *dueMemo {
	return &dueMemo{newMemo[dueState](maxAge, 0, limit, healthy, now)}
}

// quiet reports whether a read of node at fencing may be skipped: the last
// read found it quiet at that fencing token, and the memo may rely on it.
func (m *dueMemo) quiet(nodeID string, fencing int64) bool {
	st, ok := m.get(nodeID)
	return ok && st.fencing == fencing && !st.awaiting
}

// put records what the read (or claim) begun with token found, at fencing:
// kept only when quiet or awaiting and no forget came since begin;
// otherwise the node's entry goes.
func (m *dueMemo) put(nodeID string, token uint64, fencing int64, quiet, awaiting bool) {
	m.memo.put(nodeID, token, dueState{fencing: fencing, awaiting: !quiet}, quiet || awaiting)
}

// settled records that a settlement of the node's commands at fencing,
// once committed, left it no pending command: an awaiting entry (still
// there, so nothing was announced for the node since it was read) is
// quiet now.
func (m *dueMemo) settled(nodeID string, fencing int64) {
	m.memo.replace(nodeID, func(st dueState) bool { return st.fencing == fencing && st.awaiting }, dueState{fencing: fencing})
}
