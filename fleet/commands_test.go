package fleet_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

func launch(op string) fleet.IssueCommand {
	return fleet.IssueCommand{OperationID: op, Kind: api.KindLaunchWorkload,
		Payload: json.RawMessage(`{"run_id":"run-` + op + `","attempt_id":"1","command":"true"}`)}
}

func prepare(op string) fleet.IssueCommand {
	return fleet.IssueCommand{OperationID: op, Kind: api.KindPrepareArtifact,
		Payload: json.RawMessage(`{"artifact_id":"a","url":"http://127.0.0.1/a","sha256":"` + sha64 + `"}`)}
}

const sha64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func (b *bundle) issue(t *testing.T, node string, c fleet.IssueCommand) fleet.Command {
	t.Helper()
	c.NodeID = node
	cmd, _, err := b.svc.Issue(ctx, "admin:test", c)
	require.NoError(t, err)
	return cmd
}

func ops(cmds []fleet.Command) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.OperationID
	}
	return out
}

func TestIssue(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		t.Run("RecordedBeforeDeliveryWithFencingToken", func(t *testing.T) {
			c := b.issue(t, id, launch("op-rec"))
			require.Equal(t, fleet.CommandPending, c.State)
			require.Equal(t, sess.Fencing, c.FencingToken)
			require.Equal(t, b.clock.Now(), c.IssuedAt)
			stored, err := b.svc.Command(ctx, "op-rec")
			require.NoError(t, err)
			require.Equal(t, c, stored)
		})
		t.Run("IdempotentByOperationID", func(t *testing.T) {
			first := b.issue(t, id, launch("op-idem"))
			in := launch("op-idem")
			in.NodeID = id
			in.Payload = json.RawMessage(`{ "command": "true", "attempt_id": "1", "run_id": "run-op-idem" }`)
			again, created, err := b.svc.Issue(ctx, "a", in)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, first, again)
		})
		t.Run("SameIDOtherCommandConflicts", func(t *testing.T) {
			b.issue(t, id, launch("op-conf"))
			in := launch("op-conf")
			in.NodeID = id
			in.Payload = json.RawMessage(`{"run_id":"other","attempt_id":"1","command":"true"}`)
			_, _, err := b.svc.Issue(ctx, "a", in)
			requireCode(t, err, fleet.ErrOperationConflict)
		})
		t.Run("RefusedPrepareIsReissuedRefusedLaunchStaysSpent", func(t *testing.T) {
			b.issue(t, id, prepare("op-prep"))
			b.issue(t, id, launch("op-launch"))
			_, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			_, err = b.svc.Settle(ctx, sess, []api.Result{{OperationID: "op-prep", Failure: "download failed"}, {OperationID: "op-launch", Failure: "exec failed"}})
			require.NoError(t, err)
			p, created, err := b.svc.Issue(ctx, "a", fleet.IssueCommand{NodeID: id, OperationID: "op-prep", Kind: api.KindPrepareArtifact, Payload: prepare("x").Payload})
			require.NoError(t, err)
			require.True(t, created)
			require.Equal(t, fleet.CommandPending, p.State)
			l, created, err := b.svc.Issue(ctx, "a", fleet.IssueCommand{NodeID: id, OperationID: "op-launch", Kind: api.KindLaunchWorkload, Payload: launch("op-launch").Payload})
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, fleet.CommandRefused, l.State)
		})
		t.Run("Validation", func(t *testing.T) {
			cases := map[string]fleet.IssueCommand{
				"kind":                  {NodeID: id, OperationID: "v1", Kind: "reboot", Payload: json.RawMessage(`{}`)},
				"operation_id":          {NodeID: id, OperationID: "bad id", Kind: api.KindLaunchWorkload, Payload: launch("v").Payload},
				"payload":               {NodeID: id, OperationID: "v2", Kind: api.KindLaunchWorkload, Payload: json.RawMessage(`[1]`)},
				"payload/command":       {NodeID: id, OperationID: "v3", Kind: api.KindLaunchWorkload, Payload: json.RawMessage(`{"run_id":"r","attempt_id":"1"}`)},
				"payload/sha256":        {NodeID: id, OperationID: "v4", Kind: api.KindPrepareArtifact, Payload: json.RawMessage(`{"artifact_id":"a","url":"http://x/a","sha256":"nope"}`)},
				"payload/grace_seconds": {NodeID: id, OperationID: "v5", Kind: api.KindStopWorkload, Payload: json.RawMessage(`{"run_id":"r","attempt_id":"1","grace_seconds":-1}`)},
			}
			for field, in := range cases {
				_, _, err := b.svc.Issue(ctx, "a", in)
				var e *errcode.Error
				require.ErrorAs(t, err, &e, field)
				require.Equal(t, errcode.ValidationFailed, e.Code, field)
				require.Equal(t, field, e.Fields[0].Field)
			}
		})
		t.Run("OnlyReadyNodes", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			_, _, err := b.svc.Issue(ctx, "a", fleet.IssueCommand{NodeID: boot.NodeID, OperationID: "nr", Kind: api.KindLaunchWorkload, Payload: launch("nr").Payload})
			requireCode(t, err, fleet.ErrNodeNotReady)
			_, err = b.svc.Retire(ctx, "a", boot.NodeID, "")
			require.NoError(t, err)
			_, _, err = b.svc.Issue(ctx, "a", fleet.IssueCommand{NodeID: boot.NodeID, OperationID: "nr", Kind: api.KindLaunchWorkload, Payload: launch("nr").Payload})
			requireCode(t, err, fleet.ErrNodeRetired)
			_, _, err = b.svc.Issue(ctx, "a", fleet.IssueCommand{NodeID: "missing", OperationID: "nr", Kind: api.KindLaunchWorkload, Payload: launch("nr").Payload})
			requireCode(t, err, fleet.ErrNotFound)
		})
	})
}

// TestIssueMany: a release validates each distinct payload once, and
// each command still answers the refusal Issue would answer for it alone.
func TestIssueMany(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		n1, _, _ := b.readyNode(t)
		n2, _, _ := b.readyNode(t)
		n3, _, _ := b.readyNode(t)
		shared := json.RawMessage(` { "command": "true", "attempt_id": "1", "run_id": "r" } `)
		ins := []fleet.IssueCommand{
			{NodeID: n1, OperationID: "many-1", Kind: api.KindLaunchWorkload, Payload: shared},
			{NodeID: n2, OperationID: "bad id", Kind: api.KindLaunchWorkload, Payload: shared},
			{NodeID: n2, OperationID: "many-2", Kind: api.KindLaunchWorkload, Payload: shared},
			// The same text for another kind is that kind's to judge.
			{NodeID: n3, OperationID: "many-3", Kind: api.KindPrepareArtifact, Payload: shared},
			{NodeID: n3, OperationID: "bad id", Kind: api.KindPrepareArtifact, Payload: shared},
		}
		var refused []error
		require.NoError(t, b.store.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			refused, err = b.svc.IssueManyTx(ctx, tx, ins, func([]int) (map[int]error, error) { return nil, nil })
			return err
		}))
		for i, in := range ins {
			_, _, alone := b.svc.Issue(ctx, "a", in)
			if i == 0 || i == 2 {
				require.NoError(t, refused[i], in.OperationID)
				continue
			}
			var got, want *errcode.Error
			require.ErrorAs(t, refused[i], &got, "%d", i)
			require.ErrorAs(t, alone, &want, "%d", i)
			require.Equal(t, want.Fields, got.Fields, "%d", i)
		}
		// Recorded as Issue records them: the canonical payload, one digest.
		ref := b.issue(t, n1, fleet.IssueCommand{OperationID: "many-ref", Kind: api.KindLaunchWorkload, Payload: shared})
		for _, id := range []string{"many-1", "many-2"} {
			c, err := b.svc.Command(ctx, id)
			require.NoError(t, err)
			require.JSONEq(t, string(shared), string(c.Payload))
			require.Equal(t, ref.Payload, c.Payload)
			require.Equal(t, ref.PayloadDigest, c.PayloadDigest)
		}
	})
}

func TestDelivery(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("OldestFirstAtMostBatch", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			for i := range 105 {
				b.issue(t, id, launch("batch-"+itoa(1000+i)))
				b.clock.Advance(time.Millisecond)
			}
			got, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Len(t, got, 100)
			require.Equal(t, "batch-1000", got[0].OperationID)
			require.Equal(t, "batch-1099", got[99].OperationID)
			rest, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, []string{"batch-1100", "batch-1101", "batch-1102", "batch-1103", "batch-1104"}, ops(rest))
		})
		t.Run("RedeliveredAfterVisibilityTimeout", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.issue(t, id, launch("vis"))
			got, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, []string{"vis"}, ops(got))
			b.clock.Advance(59 * time.Second)
			got, err = b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Empty(t, got, "not handed again within 60 s")
			b.clock.Advance(time.Second)
			got, err = b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, []string{"vis"}, ops(got))
			require.Equal(t, 2, got[0].DeliveryCount)
		})
		t.Run("ResumeRedeliversAtOnceAndSettlesOnce", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			other, otherSess, _ := b.readyNode(t)
			b.issue(t, id, launch("resume"))
			b.issue(t, other, launch("resume-theirs"))
			got, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, []string{"resume"}, ops(got))
			_, err = b.svc.Poll(ctx, otherSess, 0, "")
			require.NoError(t, err)
			b.clock.Advance(time.Second)
			got, err = b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Empty(t, got, "delivered 1 s ago: not handed again without resume")

			redeliveries := testutil.ToFloat64(b.metrics.Redeliveries)
			resumes := testutil.ToFloat64(b.metrics.PollResumes)
			settledMetric := testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("applied"))
			resumed, err := b.svc.PollFor(ctx, sess, fleet.PollRequest{Resume: true})
			require.NoError(t, err)
			require.Equal(t, []string{"resume"}, ops(resumed.Commands), "only this node's own work")
			require.Equal(t, 2, resumed.Commands[0].DeliveryCount)
			require.Equal(t, sess.Fencing, resumed.Commands[0].FencingToken)
			require.Equal(t, redeliveries+1, testutil.ToFloat64(b.metrics.Redeliveries))
			require.Equal(t, resumes+1, testutil.ToFloat64(b.metrics.PollResumes))
			theirs, _ := b.svc.Command(ctx, "resume-theirs")
			require.Equal(t, 1, theirs.DeliveryCount, "another node's delivery is untouched")

			// The agent had applied it and its result is on its way; it
			// answers the redelivery from its journal as a duplicate. One
			// settlement: the duplicate is answered with the recorded
			// outcome and changes nothing.
			settled, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "resume", Applied: true}})
			require.NoError(t, err)
			require.Equal(t, []api.Settled{{OperationID: "resume", State: "applied"}}, settled)
			first, _ := b.svc.Command(ctx, "resume")
			b.clock.Advance(time.Second)
			settled, err = b.svc.Settle(ctx, sess, []api.Result{{OperationID: "resume", Applied: true, Duplicate: true}})
			require.NoError(t, err)
			require.Equal(t, []api.Settled{{OperationID: "resume", State: "applied"}}, settled)
			again, _ := b.svc.Command(ctx, "resume")
			require.Equal(t, first, again, "never settled twice")
			require.Equal(t, settledMetric+1, testutil.ToFloat64(b.metrics.CommandsSettled.WithLabelValues("applied")))

			// Settled: a resuming poll does not hand it out again.
			resumed, err = b.svc.PollFor(ctx, sess, fleet.PollRequest{Resume: true})
			require.NoError(t, err)
			require.Empty(t, resumed.Commands)
		})
		t.Run("ReleasedWhenTheAnswerWasLost", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.issue(t, id, launch("lost-answer"))
			got, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.NoError(t, b.svc.Release(ctx, sess, got))
			again, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			require.Equal(t, []string{"lost-answer"}, ops(again))
		})
		t.Run("SettleAppliedDuplicateRefusedAndPerItemCodes", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			other, _, _ := b.readyNode(t)
			b.issue(t, id, launch("s1"))
			b.issue(t, id, launch("s2"))
			b.issue(t, id, launch("s3"))
			b.issue(t, other, launch("theirs"))
			_, err := b.svc.Poll(ctx, sess, 0, "")
			require.NoError(t, err)
			results := []api.Result{
				{OperationID: "s1", Applied: true},
				{OperationID: "s2", Duplicate: true, Applied: true},
				{OperationID: "s3", Failure: "exit \x00 status 1"},
				{OperationID: "nope", Applied: true},
				{OperationID: "theirs", Applied: true},
			}
			settled, err := b.svc.Settle(ctx, sess, results)
			require.NoError(t, err)
			require.Equal(t, []api.Settled{
				{OperationID: "s1", State: "applied"},
				{OperationID: "s2", State: "applied"},
				{OperationID: "s3", State: "refused", Code: "refused_by_node"},
				{OperationID: "nope", Code: "unknown_operation"},
				{OperationID: "theirs", Code: "not_this_node"},
			}, settled)
			c, _ := b.svc.Command(ctx, "s3")
			require.Equal(t, "exit  status 1", c.FailureMessage, "control characters scrubbed")
			// Settling again changes nothing and answers the same.
			again, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "s1", Failure: "late refusal"}})
			require.NoError(t, err)
			require.Equal(t, []api.Settled{{OperationID: "s1", State: "applied"}}, again)
			theirs, _ := b.svc.Command(ctx, "theirs")
			require.Equal(t, fleet.CommandPending, theirs.State)
			rec, err := b.svc.Reconcile(ctx, id)
			require.NoError(t, err)
			require.Equal(t, []string{"s1", "s2"}, rec.AppliedOperationIDs)
			require.Empty(t, rec.PendingOperationIDs)
		})
		t.Run("FencedSessionCannotFetchOrReport", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			old := b.enroll(t, boot)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			b.enroll(t, fresh)
			_, err = b.svc.Authenticate(ctx, old.SessionToken, fleet.DoorAsk)
			requireCode(t, err, fleet.ErrFenced)
			_, err = b.svc.Authenticate(ctx, old.SessionToken, fleet.DoorReport)
			requireCode(t, err, fleet.ErrFenced)
		})
	})
}

// TestReenrollment is DECISIONS.md §1: what keeps "never twice" true when a
// machine comes back without its state.
func TestReenrollment(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		boot := b.invite(t, fleet.Invite{})
		first := b.enroll(t, boot)
		sess, err := b.svc.Authenticate(ctx, first.SessionToken, fleet.DoorAsk)
		require.NoError(t, err)
		id := boot.NodeID
		b.issue(t, id, launch("delivered-launch"))
		b.issue(t, id, prepare("delivered-prepare"))
		b.issue(t, id, launch("reported-launch"))
		got, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		require.Len(t, got, 3)
		b.issue(t, id, launch("never-delivered"))

		// The machine comes back with only part of its state: it holds one
		// result the server never acknowledged.
		fresh, err := b.svc.Reinvite(ctx, "a", id, nil)
		require.NoError(t, err)
		req := enrollReq(fresh, b.clock.Now())
		req.UnacknowledgedResults = []api.Result{{OperationID: "reported-launch", Applied: true}}
		second, err := b.svc.Enroll(ctx, req)
		require.NoError(t, err)
		require.Equal(t, first.FencingToken+1, second.FencingToken)

		state := func(op string) fleet.Command {
			c, err := b.svc.Command(ctx, op)
			require.NoError(t, err)
			return c
		}
		require.Equal(t, fleet.CommandApplied, state("reported-launch").State)
		unknown := state("delivered-launch")
		require.Equal(t, fleet.CommandRefused, unknown.State)
		require.Equal(t, "outcome_unknown", unknown.FailureCode)

		sess2, err := b.svc.Authenticate(ctx, second.SessionToken, fleet.DoorAsk)
		require.NoError(t, err)
		redelivered, err := b.svc.Poll(ctx, sess2, 0, "")
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"delivered-prepare", "never-delivered"}, ops(redelivered))
		for _, c := range redelivered {
			require.Equal(t, second.FencingToken, c.FencingToken)
		}
	})
}

func TestRetireEndsWork(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, tok := b.readyNode(t)
		b.issue(t, id, launch("delivered"))
		_, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		b.issue(t, id, launch("undelivered"))
		_, err = b.svc.Retire(ctx, "a", id, "")
		require.NoError(t, err)
		u, _ := b.svc.Command(ctx, "undelivered")
		require.Equal(t, fleet.CommandRefused, u.State)
		require.Equal(t, "node_retired", u.FailureCode)
		// A delivered command still takes its result.
		settled, err := b.svc.Settle(ctx, sess, []api.Result{{OperationID: "delivered", Applied: true}})
		require.NoError(t, err)
		require.Equal(t, "applied", settled[0].State)
		_, err = b.svc.Authenticate(ctx, tok, fleet.DoorAsk)
		requireCode(t, err, fleet.ErrNodeRetired)
	})
}

type pollResult struct {
	cmds []fleet.Command
	err  error
}

func (b *bundle) pollAsync(sess fleet.Session, wait time.Duration) <-chan pollResult {
	ch := make(chan pollResult, 1)
	go func() {
		cmds, err := b.svc.Poll(ctx, sess, wait, "127.0.0.1:1")
		ch <- pollResult{cmds, err}
	}()
	return ch
}

func TestLongPoll(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("IssueWakesWaitingPoll", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			queriesBefore := testutil.ToFloat64(b.metrics.PollStoreQueries)
			directBefore := testutil.ToFloat64(b.metrics.PollDirectClaims)
			wakesBefore := testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local"))
			res := b.pollAsync(sess, time.Minute)
			// Held, and its arrival check done (and found nothing): only a
			// wake-up can answer it now.
			testwait.For(t, "poll to be held", testwait.Patience, func() bool {
				return b.svc.Hub().HeldFor(id) == 1 && testutil.ToFloat64(b.metrics.PollStoreQueries) == queriesBefore+1
			})
			b.issue(t, id, launch("wake"))
			r := <-res
			require.NoError(t, r.err)
			require.Equal(t, []string{"wake"}, ops(r.cmds))
			require.Equal(t, wakesBefore+1, testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local")))
			// One read on arrival, none per second waited; the wake-up by a
			// command recorded here claims without reading first.
			require.Equal(t, queriesBefore+1, testutil.ToFloat64(b.metrics.PollStoreQueries))
			require.Equal(t, directBefore+1, testutil.ToFloat64(b.metrics.PollDirectClaims))
		})
		t.Run("IdlePollQueriesOnce", func(t *testing.T) {
			_, sess, _ := b.readyNode(t)
			before := testutil.ToFloat64(b.metrics.PollStoreQueries)
			cmds, err := b.svc.Poll(ctx, sess, 1500*time.Millisecond, "")
			require.NoError(t, err)
			require.Empty(t, cmds)
			require.Equal(t, before+1, testutil.ToFloat64(b.metrics.PollStoreQueries))
		})
		t.Run("RetireEndsHeldPoll", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			res := b.pollAsync(sess, time.Minute)
			testwait.For(t, "poll to be held", testwait.Patience, func() bool { return b.svc.Hub().HeldFor(id) == 1 })
			_, err := b.svc.Retire(ctx, "a", id, "")
			require.NoError(t, err)
			requireCode(t, (<-res).err, fleet.ErrNodeRetired)
		})
		t.Run("ReenrollFencesHeldPoll", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			resp := b.enroll(t, boot)
			sess, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			res := b.pollAsync(sess, time.Minute)
			testwait.For(t, "poll to be held", testwait.Patience, func() bool { return b.svc.Hub().HeldFor(boot.NodeID) == 1 })
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			b.enroll(t, fresh)
			requireCode(t, (<-res).err, fleet.ErrFenced)
		})
	})
}

// TestHeldPollRenewsLease: a held long-poll is liveness, and renewing it is
// coalesced (a fleet of its own, so the flush counter counts only this node).
func TestHeldPollRenewsLease(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		b.clock.Advance(40 * time.Second) // past a third of the lease
		_, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		want := b.clock.Now().Add(90 * time.Second)
		testwait.For(t, "coalesced lease renewal", testwait.Patience, func() bool { return testutil.ToFloat64(b.metrics.HeartbeatsFlushed) == 1 })
		n, err := b.svc.Node(ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, *n.LeaseExpiresAt)
		// Polling again at once costs no further renewal.
		flushed := testutil.ToFloat64(b.metrics.HeartbeatsFlushed)
		b.clock.Advance(time.Second)
		_, err = b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		require.Equal(t, flushed, testutil.ToFloat64(b.metrics.HeartbeatsFlushed))
	})
}

// TestManyCommandsManyNodes: every command issued to many waiting nodes is
// delivered exactly once per node, with no duplicate across concurrent polls.
func TestManyCommandsManyNodes(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		const nodes, perNode = 12, 15
		type agent struct {
			id   string
			sess fleet.Session
		}
		agents := make([]agent, nodes)
		for i := range agents {
			id, sess, _ := b.readyNode(t)
			agents[i] = agent{id, sess}
		}
		var mu sync.Mutex
		received := map[string]int{}
		var wg sync.WaitGroup
		done := make(chan struct{})
		errs := make(chan error, 2*nodes)
		stop := sync.OnceFunc(func() { close(done); wg.Wait() })
		defer stop() // also when an assertion below fails
		for _, a := range agents {
			// Two pollers per node: an old connection and a new one.
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-done:
							return
						default:
						}
						cmds, err := b.svc.Poll(ctx, a.sess, 200*time.Millisecond, "")
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						for _, c := range cmds {
							received[c.OperationID]++
						}
						mu.Unlock()
					}
				}()
			}
		}
		var issuers sync.WaitGroup
		for i, a := range agents {
			issuers.Add(1)
			go func() {
				defer issuers.Done()
				for j := range perNode {
					in := launch("m-" + itoa(i) + "-" + itoa(j))
					in.NodeID = a.id
					if _, _, err := b.svc.Issue(ctx, "admin:test", in); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		issuers.Wait()
		testwait.For(t, "every command delivered", testwait.Patience, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(received) == nodes*perNode || len(errs) > 0
		})
		stop()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		for op, n := range received {
			require.Equal(t, 1, n, "%s delivered %d times", op, n)
		}
	})
}

func TestDrain(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		_, sess, _ := b.readyNode(t)
		var results []<-chan pollResult
		for range 50 {
			results = append(results, b.pollAsync(sess, time.Minute))
		}
		testwait.For(t, "polls held", testwait.Patience, func() bool { return b.svc.Hub().Held() == 50 })
		b.svc.Drain()
		for _, r := range results {
			requireCode(t, (<-r).err, fleet.ErrDraining)
		}
		_, err := b.svc.Poll(ctx, sess, time.Minute, "")
		requireCode(t, err, fleet.ErrDraining)
	})
}

// TestLiveSessionsPresence: a node that keeps re-polling stays connected
// since its first poll, without changing the replica's published set; one
// that stops is gone after the grace.
func TestLiveSessionsPresence(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		hub := b.svc.Hub()
		_, v0 := hub.Sessions("test")
		first := b.clock.Now()
		res := b.pollAsync(sess, time.Minute)
		testwait.For(t, "poll held", testwait.Patience, func() bool { return hub.HeldFor(id) == 1 })
		b.issue(t, id, launch("presence"))
		require.NoError(t, (<-res).err)
		listed, v1 := hub.Sessions("test")
		require.Len(t, listed, 1, "between two polls the node is still connected")
		require.Equal(t, first, listed[0].Since)
		require.Equal(t, v0+1, v1)

		b.clock.Advance(4 * time.Second)
		_, err := b.svc.Poll(ctx, sess, 0, "127.0.0.1:2")
		require.NoError(t, err)
		listed, v2 := hub.Sessions("test")
		require.Equal(t, v1, v2, "a re-poll within the grace changes nothing to publish")
		require.Equal(t, first, listed[0].Since)
		require.Equal(t, "127.0.0.1:2", listed[0].RemoteAddr)

		b.clock.Advance(6 * time.Second)
		listed, v3 := hub.Sessions("test")
		require.Empty(t, listed, "gone after the grace")
		require.Greater(t, v3, v2)
		live, err := b.svc.LiveSessions(ctx)
		require.NoError(t, err)
		require.Empty(t, live)
	})
}

// TestLoneReplicaPublishesNoSessionList: only other replicas read a
// replica's published session list, so a replica alone on its store
// (SQLite) writes its heartbeat row without the list — rewriting a large
// list every heartbeat held SQLite's one writer — and still answers its
// own held polls; a replica that shares its store publishes them.
func TestLoneReplicaPublishesNoSessionList(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		for _, shared := range []bool{false, true} {
			name := map[bool]string{false: "lone", true: "shared"}[shared]
			t.Run(name, func(t *testing.T) {
				replica := "r-" + randomSuffix()
				var b *bundle
				if shared {
					b = crossReplica(t, db, replica, true, nil)
				} else {
					b = setup(t, db, func(s *fleet.Settings) { s.ReplicaID = replica })
				}
				id, sess, _ := b.readyNode(t)
				res := b.pollAsync(sess, time.Minute)
				testwait.For(t, "poll held", testwait.Patience, func() bool { return b.svc.Hub().HeldFor(id) == 1 })
				require.NoError(t, fleet.PublishSessions(b.svc, b.clock.Now()))

				var published []string
				all, err := b.store.ListSessions(ctx, b.clock.Now().Add(-time.Hour))
				require.NoError(t, err)
				for _, ls := range all {
					if ls.NodeID == id {
						published = append(published, ls.NodeID)
					}
				}
				beats, err := b.store.Replicas(ctx)
				require.NoError(t, err)
				var beating bool
				for _, rb := range beats {
					beating = beating || rb.ID == replica
				}
				require.True(t, beating, "the replica's heartbeat row is written either way")
				if shared {
					require.Equal(t, []string{id}, published, "peers read a shared replica's held polls from its row")
				} else {
					require.Empty(t, published, "nobody else reads a lone replica's list")
				}

				live, err := b.svc.LiveSessions(ctx)
				require.NoError(t, err)
				var listed []string
				for _, ls := range live {
					listed = append(listed, ls.NodeID)
				}
				require.Contains(t, listed, id, "the replica lists its own held poll")

				b.issue(t, id, launch("wake-"+name))
				require.NoError(t, (<-res).err)
			})
		}
	})
}

// TestUnclaim: commands a claim took that no answer carried count as
// never delivered when it was their first delivery, so a re-enrollment
// redelivers a launch rather than ending it outcome_unknown; a
// redelivery undone keeps the earlier delivery; and only the claim that
// answered the copy is undone.
func TestUnclaim(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		id, sess, _ := b.readyNode(t)
		b.issue(t, id, launch("unsent"))
		b.issue(t, id, launch("redelivered"))
		b.issue(t, id, launch("sent"))
		state := func(op string) fleet.Command {
			c, err := b.svc.Command(ctx, op)
			require.NoError(t, err)
			return c
		}
		byOp := func(cmds []fleet.Command) map[string]fleet.Command {
			m := map[string]fleet.Command{}
			for _, c := range cmds {
				m[c.OperationID] = c
			}
			return m
		}

		got, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		claimed := byOp(got)
		require.Len(t, claimed, 3)
		// "redelivered" was answered, then its answer failed: released, due
		// again, and claimed a second time.
		require.NoError(t, b.svc.Release(ctx, sess, []fleet.Command{claimed["redelivered"]}))
		again, err := b.svc.Poll(ctx, sess, 0, "")
		require.NoError(t, err)
		require.Equal(t, []string{"redelivered"}, ops(again))
		// The first claim's copy is stale: undoing it changes nothing.
		require.NoError(t, b.svc.Unclaim(ctx, sess, []fleet.Command{claimed["redelivered"]}))
		require.Equal(t, 2, state("redelivered").DeliveryCount)
		require.NotNil(t, state("redelivered").LastDeliveredAt, "still awaiting its settlement")

		require.NoError(t, b.svc.Unclaim(ctx, sess, []fleet.Command{claimed["unsent"], again[0]}))
		unsent := state("unsent")
		require.Zero(t, unsent.DeliveryCount)
		require.Nil(t, unsent.DeliveredFencing)
		require.Nil(t, unsent.FirstDeliveredAt)
		redelivered := state("redelivered")
		require.Equal(t, 1, redelivered.DeliveryCount)
		require.NotNil(t, redelivered.DeliveredFencing, "its first answer may have reached the node")
		require.Nil(t, redelivered.LastDeliveredAt, "due again at once")

		fresh, err := b.svc.Reinvite(ctx, "a", id, nil)
		require.NoError(t, err)
		second, err := b.svc.Enroll(ctx, enrollReq(fresh, b.clock.Now()))
		require.NoError(t, err)
		require.Equal(t, fleet.CommandPending, state("unsent").State, "never sent: redelivered")
		for _, op := range []string{"sent", "redelivered"} {
			require.Equal(t, fleet.CommandRefused, state(op).State, op)
			require.Equal(t, "outcome_unknown", state(op).FailureCode, op)
		}
		sess2, err := b.svc.Authenticate(ctx, second.SessionToken, fleet.DoorAsk)
		require.NoError(t, err)
		after, err := b.svc.Poll(ctx, sess2, 0, "")
		require.NoError(t, err)
		require.Equal(t, []string{"unsent"}, ops(after))
	})
}
