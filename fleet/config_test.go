package fleet_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/internal/txroutes"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// Delivery of desired configuration in the long-poll (DECISIONS.md §32),
// proven by counters: deliveries, wake-ups and store queries per poll.

func (b *bundle) configure(t *testing.T, node, doc string, force bool) fleet.ConfigureOutcome {
	t.Helper()
	var out fleet.ConfigureOutcome
	require.NoError(t, b.store.Tx(ctx, func(tx fleet.Tx) error {
		var err error
		out, err = b.svc.ConfigureTx(ctx, tx, fleet.Configure{NodeID: node, OperationID: "cfg-" + randomSuffix(),
			Format: "test/v1", Document: json.RawMessage(doc), Force: force})
		return err
	}))
	return out
}

func (b *bundle) reportConfig(t *testing.T, sess fleet.Session, rev int64, hash, state, msg string) {
	t.Helper()
	_, err := b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "ev-" + randomSuffix(), Kind: api.EventConfig,
		ObservedAt: b.clock.Now(), Config: &api.ConfigReport{Revision: rev, Hash: hash, State: state, Message: msg}}})
	require.NoError(t, err)
}

func (b *bundle) pollNow(t *testing.T, sess fleet.Session) fleet.PollAnswer {
	t.Helper()
	a, err := b.svc.PollWork(ctx, sess, 0, "")
	require.NoError(t, err)
	return a
}

type workResult struct {
	a   fleet.PollAnswer
	err error
}

func (b *bundle) pollWorkAsync(sess fleet.Session, wait time.Duration) <-chan workResult {
	ch := make(chan workResult, 1)
	go func() {
		a, err := b.svc.PollWork(ctx, sess, wait, "127.0.0.1:1")
		ch <- workResult{a, err}
	}()
	return ch
}

// holdPoll starts a long-poll and waits until it is held past its arrival
// check (so only a wake-up, or its deadline, can answer it).
func (b *bundle) holdPoll(t *testing.T, id string, sess fleet.Session) <-chan workResult {
	t.Helper()
	before := testutil.ToFloat64(b.metrics.PollStoreQueries)
	res := b.pollWorkAsync(sess, time.Minute)
	testwait.For(t, "poll to be held", testwait.Patience, func() bool {
		return b.svc.Hub().HeldFor(id) == 1 && testutil.ToFloat64(b.metrics.PollStoreQueries) == before+1
	})
	return res
}

func (b *bundle) dueWork(t *testing.T, sess fleet.Session) fleet.DueWork {
	t.Helper()
	now := b.clock.Now()
	w, err := b.store.DueWork(ctx, fleet.Due{NodeID: sess.NodeID, Fencing: sess.Fencing, RedeliverBefore: now.Add(-time.Minute), Now: now, Limit: 100})
	require.NoError(t, err)
	return w
}

// routeLog is a fleet.Store that records the route of every routed
// transaction.
type routeLog struct {
	fleet.Store
	txroutes.Log
}

func (s *routeLog) Tx(ctx context.Context, fn func(fleet.Tx) error) error {
	s.Note(ctx)
	return s.Store.Tx(ctx, fn)
}

// A fleet.configure's wave sets off a delivery and a report on every node
// at once. Both are background writes, so the fleet's other writes do not
// queue behind them, and the report finishes what its delivery handed out,
// so it goes ahead of the deliveries still queued (fleet.TxRoute). A
// workload event, and a delivery riding beside commands, are neither.
func TestConfigWaveWritesAreBackground(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		log := &routeLog{}
		b := setupWrapped(t, db, func(s fleet.Store) fleet.Store { log.Store = s; return log })
		id, sess, _ := b.readyNode(t)
		out := b.configure(t, id, `{"a":1}`, false)
		log.Take()

		require.NotNil(t, b.pollNow(t, sess).Config)
		require.Contains(t, log.Take(), fleet.TxRoute{Node: id, Background: true}, "the delivery alone in its answer")

		b.reportConfig(t, sess, 1, out.Hash, api.ConfigApplied, "")
		require.Equal(t, []fleet.TxRoute{{Node: id, Background: true, Finishing: true}}, log.Take(), "the report")

		_, err := b.svc.RecordEvents(ctx, sess, []api.Event{{ID: "ev-" + randomSuffix(), Kind: api.EventWorkload, ObservedAt: b.clock.Now(),
			Workload: &api.WorkloadObservation{RunID: "r1", AttemptID: "a1", State: api.WorkloadRunning, ObservedAt: b.clock.Now()}}})
		require.NoError(t, err)
		require.Equal(t, []fleet.TxRoute{{Node: id}}, log.Take(), "a workload event")

		b.configure(t, id, `{"a":2}`, false)
		b.issue(t, id, prepare("op-beside-config"))
		log.Take()
		a := b.pollNow(t, sess)
		require.NotNil(t, a.Config)
		require.Len(t, a.Commands, 1)
		for _, r := range log.Take() {
			require.False(t, r.Background, "a delivery beside commands: their answer waits on it")
		}
	})
}

func TestConfigDelivery(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("RidesInPollAnswer", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			require.Nil(t, b.pollNow(t, sess).Config, "nothing configured: nothing due")
			out := b.configure(t, id, `{"port":80}`, false)
			a := b.pollNow(t, sess)
			require.Empty(t, a.Commands, "configuration takes no command slot")
			require.Equal(t, &api.ConfigDelivery{Revision: 1, Hash: out.Hash, Format: "test/v1", Document: json.RawMessage(`{"port":80}`)}, a.Config)
		})
		t.Run("NewRevisionWakesHeldPoll", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			queries := testutil.ToFloat64(b.metrics.PollStoreQueries)
			wakes := testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local"))
			res := b.holdPoll(t, id, sess)
			b.configure(t, id, `{"a":1}`, false)
			r := <-res
			require.NoError(t, r.err)
			require.NotNil(t, r.a.Config)
			require.Equal(t, int64(1), r.a.Config.Revision)
			require.Equal(t, wakes+1, testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local")))
			require.Equal(t, queries+2, testutil.ToFloat64(b.metrics.PollStoreQueries), "one query on arrival, one on the wake-up")
		})
		t.Run("ResumeRepushesAtOnce", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.configure(t, id, `{"a":1}`, false)
			require.NotNil(t, b.pollNow(t, sess).Config)
			b.clock.Advance(time.Second)
			require.Equal(t, fleet.ConfigRides, b.dueWork(t, sess).Config, "delivered 1 s ago: it would not cut a wait short")
			deliveries := testutil.ToFloat64(b.metrics.ConfigDeliveries)
			queries := testutil.ToFloat64(b.metrics.PollStoreQueries)
			wakes := testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local"))
			// A held poll that resumes is answered on arrival: the
			// delivery it may have lost is due at once.
			pctx, cancel := context.WithCancel(ctx)
			defer cancel()
			res := make(chan workResult, 1)
			go func() {
				a, err := b.svc.PollFor(pctx, sess, fleet.PollRequest{Wait: 2 * testwait.Patience, Resume: true})
				res <- workResult{a, err}
			}()
			var r workResult
			select {
			case r = <-res:
			case <-time.After(testwait.Patience):
				t.Fatal("a resuming poll was held for a configuration it may have lost")
			}
			require.NoError(t, r.err)
			require.NotNil(t, r.a.Config)
			require.Equal(t, int64(1), r.a.Config.Revision)
			require.Equal(t, deliveries+1, testutil.ToFloat64(b.metrics.ConfigDeliveries))
			require.Equal(t, queries+1, testutil.ToFloat64(b.metrics.PollStoreQueries), "answered on its arrival check")
			require.Equal(t, wakes, testutil.ToFloat64(b.metrics.Wakeups.WithLabelValues("local")), "no wake-up needed")
		})
		t.Run("NoRepushWithinVisibilityTimeout", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.configure(t, id, `{"a":1}`, false)
			deliveries := testutil.ToFloat64(b.metrics.ConfigDeliveries)
			require.NotNil(t, b.pollNow(t, sess).Config)
			require.Equal(t, deliveries+1, testutil.ToFloat64(b.metrics.ConfigDeliveries))
			// Delivered to this fencing token moments ago: a new poll is
			// held (it does not answer at once for it) ...
			res := b.holdPoll(t, id, sess)
			require.Empty(t, res, "the delivered configuration does not cut the wait short")
			// ... and it rides along with the next answer.
			_, _, err := b.svc.Issue(ctx, "admin:test", fleet.IssueCommand{NodeID: id, OperationID: "ride-" + randomSuffix(),
				Kind: api.KindPrepareImage, Payload: json.RawMessage(`{"image":"x"}`)})
			require.NoError(t, err)
			r := <-res
			require.NoError(t, r.err)
			require.Len(t, r.a.Commands, 1)
			require.NotNil(t, r.a.Config, "the configuration rides along with the answer")
			// An answer that could not be written is released: due at once.
			require.NoError(t, b.svc.ReleaseConfig(ctx, sess))
			r = <-b.pollWorkAsync(sess, time.Minute)
			require.NoError(t, r.err)
			require.NotNil(t, r.a.Config)
			// Past the visibility timeout it answers a poll at once again.
			b.clock.Advance(61 * time.Second)
			r = <-b.pollWorkAsync(sess, time.Minute)
			require.NoError(t, r.err)
			require.NotNil(t, r.a.Config)
		})
		t.Run("AppliedStopsThePush", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			out := b.configure(t, id, `{"a":1}`, false)
			b.reportConfig(t, sess, out.Revision, out.Hash, api.ConfigApplied, "")
			queries := testutil.ToFloat64(b.metrics.PollStoreQueries)
			require.Nil(t, b.pollNow(t, sess).Config)
			require.Equal(t, queries+1, testutil.ToFloat64(b.metrics.PollStoreQueries), "an idle poll is still one query")
			view, err := b.svc.NodeConfig(ctx, id)
			require.NoError(t, err)
			require.Equal(t, fleet.VerdictApplied, view.Verdict)
			require.Equal(t, int64(1), view.AppliedRevision)
			// A report naming another hash is judged, and moves nothing.
			b.reportConfig(t, sess, out.Revision, strings.Repeat("0", 64), api.ConfigApplied, "")
			view, err = b.svc.NodeConfig(ctx, id)
			require.NoError(t, err)
			require.Equal(t, fleet.VerdictMismatch, view.Verdict)
			require.Equal(t, int64(1), view.AppliedRevision)
		})
		t.Run("NoPushAfterFailedUntilForced", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			out := b.configure(t, id, `{"a":1}`, false)
			require.Equal(t, fleet.ConfigWakes, b.dueWork(t, sess).Config)
			require.NotNil(t, b.pollNow(t, sess).Config)
			require.Equal(t, fleet.ConfigRides, b.dueWork(t, sess).Config, "delivered moments ago: rides along")
			b.reportConfig(t, sess, out.Revision, out.Hash, api.ConfigFailed, "bad port")
			require.Equal(t, fleet.ConfigNotDue, b.dueWork(t, sess).Config)
			require.Nil(t, b.pollNow(t, sess).Config, "failed: not pushed again")
			again := b.configure(t, id, `{"a":1}`, false)
			require.True(t, again.Failed, "an unchanged document, not forced: ends failed at once")
			require.Equal(t, "bad port", again.Message)
			require.Nil(t, b.pollNow(t, sess).Config)
			forced := b.configure(t, id, `{"a":1}`, true)
			require.Equal(t, out.Revision, forced.Revision, "forcing keeps the revision")
			require.Equal(t, fleet.ConfigWakes, b.dueWork(t, sess).Config, "forced: pushed at once, however recently delivered")
			a := b.pollNow(t, sess)
			require.NotNil(t, a.Config, "forced: due again")
			require.Equal(t, out.Revision, a.Config.Revision)
			// A changed document is due again too.
			b.reportConfig(t, sess, out.Revision, out.Hash, api.ConfigFailed, "still bad")
			require.Nil(t, b.pollNow(t, sess).Config)
			b.configure(t, id, `{"a":2}`, false)
			require.NotNil(t, b.pollNow(t, sess).Config)
		})
		t.Run("DueAgainAfterReenrollment", func(t *testing.T) {
			boot := b.invite(t, fleet.Invite{})
			resp := b.enroll(t, boot)
			sess, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			out := b.configure(t, boot.NodeID, `{"a":1}`, false)
			b.reportConfig(t, sess, out.Revision, out.Hash, api.ConfigApplied, "")
			require.Nil(t, b.pollNow(t, sess).Config)
			fresh, err := b.svc.Reinvite(ctx, "a", boot.NodeID, nil)
			require.NoError(t, err)
			resp = b.enroll(t, fresh)
			sess2, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
			require.NoError(t, err)
			require.NotEqual(t, sess.Fencing, sess2.Fencing)
			a := b.pollNow(t, sess2)
			require.NotNil(t, a.Config, "a fencing bump makes it due again")
			b.reportConfig(t, sess2, out.Revision, out.Hash, api.ConfigApplied, "")
			require.Nil(t, b.pollNow(t, sess2).Config)
		})
		t.Run("ReportWithoutDesiredIsMismatch", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			b.reportConfig(t, sess, 4, strings.Repeat("a", 64), api.ConfigApplied, "")
			view, err := b.svc.NodeConfig(ctx, id)
			require.NoError(t, err)
			require.Nil(t, view.Desired)
			require.Equal(t, fleet.VerdictMismatch, view.Verdict)
			require.Zero(t, view.AppliedRevision)
			require.False(t, view.Lagging)
			out := b.configure(t, id, `{"a":1}`, false)
			require.Equal(t, int64(1), out.Revision, "the first desired revision is still 1")
			require.NotNil(t, b.pollNow(t, sess).Config)
		})
		t.Run("ReportsAreDeduplicatedAndBounded", func(t *testing.T) {
			id, sess, _ := b.readyNode(t)
			out := b.configure(t, id, `{"a":1}`, false)
			ev := api.Event{ID: "dup-" + randomSuffix(), Kind: api.EventConfig, ObservedAt: b.clock.Now(),
				Config: &api.ConfigReport{Revision: out.Revision, Hash: out.Hash, State: api.ConfigFailed, Message: strings.Repeat("x", 10000)}}
			res, err := b.svc.RecordEvents(ctx, sess, []api.Event{ev})
			require.NoError(t, err)
			require.Equal(t, fleet.EventsResult{Recorded: 1}, res)
			res, err = b.svc.RecordEvents(ctx, sess, []api.Event{ev})
			require.NoError(t, err)
			require.Equal(t, fleet.EventsResult{Duplicates: 1}, res)
			view, err := b.svc.NodeConfig(ctx, id)
			require.NoError(t, err)
			require.LessOrEqual(t, len(view.Reported.Message), fleet.MaxConfigMessageBytes, "truncated, never refused")
			require.Equal(t, fleet.VerdictFailed, view.Verdict)
		})
	})
}

// TestConfigureManyTxDecidesEachDocument: a batch whose configures share a
// document makes it canonical and hashes it once, so the batch must still
// tell documents apart: each node gets its own document's hash, and a
// configure refused for its format refuses no neighbour sharing its
// document.
func TestConfigureManyTxDecidesEachDocument(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		nodes := make([]string, 6)
		for i := range nodes {
			nodes[i], _, _ = b.readyNode(t)
		}
		a, c := json.RawMessage(`{"b":2, "a":1}`), json.RawMessage(`{"a":2}`)
		ins := []fleet.Configure{
			{Format: "test/v1", Document: a},
			{Format: "test/v1", Document: a},
			{Format: "bad format", Document: a},
			{Format: "test/v1", Document: a},
			{Format: "test/v2", Document: a},
			{Format: "test/v1", Document: c},
		}
		for i := range ins {
			ins[i].NodeID, ins[i].OperationID = nodes[i], "cfg-"+randomSuffix()
		}
		var outs []fleet.ConfigureOutcome
		var refused []error
		require.NoError(t, b.store.Tx(ctx, func(tx fleet.Tx) error {
			var err error
			outs, refused, err = b.svc.ConfigureManyTx(ctx, tx, ins, func([]int) (map[int]error, error) { return nil, nil })
			return err
		}))
		for i, in := range ins {
			if i == 2 {
				require.ErrorContains(t, refused[i], "operation/format")
				cfg, err := b.svc.NodeConfig(ctx, in.NodeID)
				require.NoError(t, err)
				require.Nil(t, cfg.Desired, "a refused configure writes nothing")
				continue
			}
			require.NoError(t, refused[i], "configure %d", i)
			want, err := fleet.ConfigHash(in.Format, in.Document)
			require.NoError(t, err)
			require.Equal(t, want, outs[i].Hash, "configure %d", i)
			cfg, err := b.svc.NodeConfig(ctx, in.NodeID)
			require.NoError(t, err)
			require.Equal(t, want, cfg.Desired.Hash, "configure %d", i)
			require.Equal(t, in.Format, cfg.Desired.Format, "configure %d", i)
		}
		require.NotEqual(t, outs[0].Hash, outs[4].Hash, "the format is hashed with the document")
		require.NotEqual(t, outs[0].Hash, outs[5].Hash)
	})
}
