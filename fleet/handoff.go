package fleet

import (
	"context"
	"time"
)

// A command recorded for a node whose agent holds a long-poll on this
// replica is recorded delivered to that poll by the statement that records
// it (as a claim's first delivery would leave it, its operation running),
// and handed to the poll once that transaction commits: the poll answers
// at once, without a claim of its own. That is one transaction (on an
// idle store, one commit and its round trips) fewer per command, one
// commit fewer between the submit and the agent's receipt, and no claim
// statement in the submit's.
//
// Nothing is delivered that is not durable first: the delivery commits
// with the command. A poll that took another answer before the hand-off
// (its deadline, its agent gone, a claim of its own) is not handed anything;
// the commands are released (due again at once, announced), as an answer
// that could not be written is, and at worst the visibility timeout
// brings them back.

// handoff is what a committed recording hands to a poll (NotifyHanded).
type handoff struct {
	w    *waiter
	cmds []Command
	// token is the due memo's, taken before the recording; fencing the poll's.
	token   uint64
	fencing int64
}

// pollToHand answers the hand-off of a command about to be recorded for
// node to the long-poll this replica holds for it, when the node was quiet
// before (the due memo: no other command pending, no configuration due or
// riding), so the command answers the poll whole; nil when there is none.
// A resuming poll qualifies too: with nothing pending before this command,
// its arrival makes nothing due again. The command is recorded delivered
// to the poll's fencing token only if the node still has that token under
// the recording's lock (IssueToNode), so a poll of a superseded session is
// never handed anything.
//
// The memo is a hint here, not a guard, as in handToHeldPolls: were the
// node not quiet after all, the poll answers this command alone and the
// memo says the node awaits a settlement, so its next poll reads and
// claims the rest.
func (s *Service) pollToHand(nodeID string) *handoff {
	w, fencing := s.hub.held(nodeID)
	if w == nil || !s.quiet.quiet(nodeID, fencing) {
		return nil
	}
	return &handoff{w: w, token: s.quiet.begin(nodeID), fencing: fencing}
}

// handToHeldPolls marks, among commands about to be inserted together (a
// fan-out's release, IssueManyTx), each one whose agent holds a long-poll
// on this replica at the command's fencing token, whose node was quiet
// (the due memo) and has no other command among them, as delivered to
// that poll at now. Inserted so, it needs no claim: the insert is its
// first delivery (the store marks its operation running, as a claim's
// first delivery does), and the poll is handed it once the transaction
// commits. It answers the hand-offs by index into cs.
//
// The memo is a hint here, not a guard: were the node not quiet after all
// (another command pending, a configuration due), the poll answers this
// command alone and the memo says the node awaits a settlement, so its
// next poll reads and claims the rest.
func (s *Service) handToHeldPolls(cs []Command, now time.Time) map[int]*handoff {
	var handed map[int]*handoff
	perNode := make(map[string]int, len(cs))
	for _, c := range cs {
		perNode[c.NodeID]++
	}
	for i := range cs {
		c := &cs[i]
		if perNode[c.NodeID] != 1 {
			continue
		}
		w, fencing := s.hub.held(c.NodeID)
		if w == nil || fencing != c.FencingToken || !s.quiet.quiet(c.NodeID, fencing) {
			continue
		}
		token := s.quiet.begin(c.NodeID)
		at := now
		c.DeliveredFencing, c.FirstDeliveredAt, c.LastDeliveredAt, c.DeliveryCount = &fencing, &at, &at, 1
		if handed == nil {
			handed = map[int]*handoff{}
		}
		handed[i] = &handoff{w: w, cmds: []Command{*c}, token: token, fencing: fencing}
	}
	return handed
}

// handOff gives a committed recording's commands to its poll; a poll that
// has answered already gets nothing, and the commands are released.
func (s *Service) handOff(nodeID string, h *handoff) {
	if h.w.hand(h.cmds) {
		// Delivered, awaiting the agent's settlement.
		s.quiet.put(nodeID, h.token, h.fencing, false, true)
		s.metrics.PollHandoffs.Inc()
		s.observeDeliveries(h.cmds, s.clock())
		return
	}
	s.quiet.forget(nodeID)
	sess := Session{NodeID: nodeID, Fencing: h.fencing}
	// Not on the committing goroutine: Unclaim is a transaction of its own.
	go func() {
		if err := s.Unclaim(context.Background(), sess, h.cmds); err != nil {
			s.log.Warn("release commands claimed for a poll that had answered", "node_id", nodeID, "err", err)
		}
	}()
}

// handedIssues marks, in notes, each NotifyIssued whose command a
// NotifyHanded after it (the same request's: its hand-off came right after
// the insert) hands to the node's poll: the hand-off answers that poll,
// so the wake-up and the memo's forget are not needed, and the forget
// would void the memo's record that the node awaits the settlement.
// It answers nil when notes hand nothing over.
func handedIssues(notes []Notification) map[int]bool {
	var skip map[int]bool
	for i, n := range notes {
		if n.Kind != NotifyHanded {
			continue
		}
		for j := i - 1; j >= 0; j-- {
			if notes[j].Kind == NotifyIssued && notes[j].NodeID == n.NodeID {
				if skip == nil {
					skip = map[int]bool{}
				}
				skip[j] = true
				break
			}
		}
	}
	return skip
}
