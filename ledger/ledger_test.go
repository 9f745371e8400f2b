package ledger_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

func TestStateMachine(t *testing.T) {
	cases := []struct {
		from, to ledger.State
		ok       bool
	}{
		{ledger.StatePending, ledger.StateRunning, true},
		{ledger.StatePending, ledger.StateCancelled, true},
		{ledger.StatePending, ledger.StateFailed, true},
		{ledger.StatePending, ledger.StateSucceeded, true},
		{ledger.StateRunning, ledger.StateSucceeded, true},
		{ledger.StateRunning, ledger.StateFailed, true},
		{ledger.StateRunning, ledger.StateCancelled, true},
		{ledger.StateRunning, ledger.StatePending, true},
		{ledger.StatePending, ledger.StatePending, false},
		{ledger.StateRunning, ledger.StateRunning, false},
	}
	for _, end := range []ledger.State{ledger.StateSucceeded, ledger.StateFailed, ledger.StateCancelled} {
		for _, to := range ledger.States {
			cases = append(cases, struct {
				from, to ledger.State
				ok       bool
			}{end, to, false})
		}
	}
	for _, c := range cases {
		require.Equal(t, c.ok, ledger.CanTransition(c.from, c.to), "%s → %s", c.from, c.to)
	}
}

func TestDigestIsCanonical(t *testing.T) {
	a, err := ledger.Digest("k", []ledger.Target{{Kind: "node", ID: "n1"}}, json.RawMessage(`{"b":1,"a":[1.0,"x"]}`))
	require.NoError(t, err)
	b, err := ledger.Digest("k", []ledger.Target{{Kind: "node", ID: "n1"}}, json.RawMessage("{ \"a\" : [1, \"x\"], \"b\" : 1.00 }"))
	require.NoError(t, err)
	require.Equal(t, a, b, "formatting, member order and number spelling do not change the digest")
	c, err := ledger.Digest("k", []ledger.Target{{Kind: "node", ID: "n2"}}, json.RawMessage(`{"b":1,"a":[1,"x"]}`))
	require.NoError(t, err)
	require.NotEqual(t, a, c, "targets are part of the digest")
	d, err := ledger.Digest("k2", []ledger.Target{{Kind: "node", ID: "n1"}}, json.RawMessage(`{"b":1,"a":[1,"x"]}`))
	require.NoError(t, err)
	require.NotEqual(t, a, d, "the kind is part of the digest")
}

// TestFanOutChildDigestsAreTheirRequestsDigests: a fan-out digests its
// children in turn, hashing what they share once; each digest is the one
// its request alone has, whether the kind, the operation or only the
// target changed from the child before.
func TestFanOutChildDigestsAreTheirRequestsDigests(t *testing.T) {
	big := json.RawMessage(`{"document":{"pad":"` + strings.Repeat("p", 4096) + `"},"format":"f/v1"}`)
	small := json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"x"}}`)
	node := func(id string) []ledger.Target { return []ledger.Target{{Kind: "node", ID: id}} }
	kinds := []string{"node.configure", "node.configure", "node.configure", "node.prepare_image", "node.prepare_image", "node.configure", "node.configure"}
	targets := [][]ledger.Target{node("n1"), node("n2"), node("n2"), node("n1"), nil, node("n3"), node("n1")}
	ops := []json.RawMessage{big, big, small, small, small, big, append(json.RawMessage(nil), big...)}
	got, err := ledger.DigestInTurn(kinds, targets, ops)
	require.NoError(t, err)
	seen := map[string]bool{}
	for i := range kinds {
		want, err := ledger.Digest(kinds[i], targets[i], ops[i])
		require.NoError(t, err)
		require.Equal(t, want, got[i], "request %d", i)
		seen[got[i]] = true
	}
	require.Len(t, seen, len(kinds)-1, "only the first and last requests are the same request")
}

// TestDigestIsTheCanonicalBody: the digest, made from the members'
// canonical forms, is the SHA-256 of the canonical JSON of the whole body
// {kind, targets, operation} (DECISIONS.md §13), for strings JSON escapes
// in more than one way, numbers with more than one spelling, members out
// of order, and no targets or operation.
func TestDigestIsTheCanonicalBody(t *testing.T) {
	cases := []struct {
		kind      string
		targets   []ledger.Target
		operation string
	}{
		{"node.configure", []ledger.Target{{Kind: "node", ID: "n1"}}, `{"format":"f/v1","document":{"z":1e2,"a":[0.10,-0,"<&>"]}}`},
		{"k<&>", []ledger.Target{{Kind: "node", ID: "é \"x"}, {Kind: "fleet"}}, `{"s":"\u00e9\ud83d\ude00\n","b":true,"n":null}`},
		{"fleet.command", nil, `{}`},
		{"test.noop", []ledger.Target{}, ``},
	}
	for _, c := range cases {
		got, err := ledger.Digest(c.kind, c.targets, json.RawMessage(c.operation))
		require.NoError(t, err)
		targets, operation := c.targets, json.RawMessage(c.operation)
		if targets == nil {
			targets = []ledger.Target{}
		}
		if len(operation) == 0 {
			operation = json.RawMessage(`{}`)
		}
		body, err := json.Marshal(struct {
			Kind      string          `json:"kind"`
			Targets   []ledger.Target `json:"targets"`
			Operation json.RawMessage `json:"operation"`
		}{c.kind, targets, operation})
		require.NoError(t, err)
		canon, err := ledger.Canonical(body)
		require.NoError(t, err)
		sum := sha256.Sum256(canon)
		require.Equal(t, hex.EncodeToString(sum[:]), got, "%s %s", c.kind, c.operation)
	}
}

func TestSubmit(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("ReplayAnswersTheSameOperation", func(t *testing.T) {
			sub := ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"x":1, "y":[2]}`)}
			first, created, err := b.svc.Submit(ctx, admin, sub)
			require.NoError(t, err)
			require.True(t, created)
			require.Equal(t, ledger.StatePending, first.State)
			require.Equal(t, `{"x":1,"y":[2]}`, string(first.Operation), "stored canonical")
			sub.Operation = json.RawMessage(`{"y":[2],"x":1.0}`)
			again, created, err := b.svc.Submit(ctx, admin, sub)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, first.ID, again.ID)
			require.Equal(t, []string{ledger.EventSubmitted}, eventTypes(t, b, first.ID))
		})
		t.Run("SameRequestOtherBodyIsConflict", func(t *testing.T) {
			sub := ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"x":1}`)}
			_, _, err := b.svc.Submit(ctx, admin, sub)
			require.NoError(t, err)
			before := countOps(t, b)
			sub.Operation = json.RawMessage(`{"x":2}`)
			_, _, err = b.svc.Submit(ctx, admin, sub)
			requireCode(t, err, errcode.RequestConflict)
			require.Equal(t, before, countOps(t, b))
		})
		t.Run("RequestIDsArePerPrincipal", func(t *testing.T) {
			rid := newRequestID()
			a, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: rid, Kind: "test.noop"})
			require.NoError(t, err)
			h, created, err := b.svc.Submit(ctx, host("h-per", "test"), ledger.Submission{RequestID: rid, Kind: "test.noop"})
			require.NoError(t, err)
			require.True(t, created)
			require.NotEqual(t, a.ID, h.ID)
		})
		t.Run("RefusalsRecordNothing", func(t *testing.T) {
			before := countOps(t, b)
			_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "node.teleport"})
			requireCode(t, err, errcode.KindNotServed)
			_, _, err = b.svc.Submit(ctx, host("h-deny", "nodes"), ledger.Submission{RequestID: newRequestID(), Kind: "test.noop"})
			requireCode(t, err, errcode.PermissionDenied)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"fail":true}`)})
			requireCode(t, err, errcode.ValidationFailed)
			for _, bad := range []string{"", "has space", "ü", string(make([]byte, 129))} {
				_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: bad, Kind: "test.noop"})
				requireCode(t, err, errcode.ValidationFailed)
			}
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`[1]`)})
			requireCode(t, err, errcode.ValidationFailed)
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Wait: 61 * time.Second})
			requireCode(t, err, errcode.ValidationFailed)
			require.Equal(t, before, countOps(t, b))
		})
	})
}

func TestSubmitConcurrentSameRequestIsOneOperation(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		rid := newRequestID()
		submitAtOnce(t, b, ledger.Submission{RequestID: rid, Kind: "test.noop", Operation: json.RawMessage(`{"a":1}`)})
		require.Equal(t, int64(1), dbtest.Count(t, b.db.DB, &models.Operation{}, "request_id = ?", rid))
	})
}

// submitAtOnce submits sub 16 times at once and requires one of them to
// have recorded it and every other to answer the same operation.
func submitAtOnce(t *testing.T, b *bundle, sub ledger.Submission) {
	t.Helper()
	const n = 16
	ids := make([]string, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			op, c, err := b.svc.Submit(ctx, admin, sub)
			ids[i], created[i], errs[i] = op.ID, c, err
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ids[0], ids[i])
		if created[i] {
			winners++
		}
	}
	require.Equal(t, 1, winners)
}

func TestQuotas(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		t.Run("PerNode", func(t *testing.T) {
			var last ledger.Submission
			for i := range 32 {
				last = ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"node":"n-quota","i":` + strconv.Itoa(i) + `}`)}
				_, _, err := b.svc.Submit(ctx, admin, last)
				require.NoError(t, err, "operation %d", i+1)
			}
			before := countOps(t, b)
			_, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"node":"n-quota"}`)})
			requireCode(t, err, errcode.QuotaExceeded)
			require.Equal(t, before, countOps(t, b))
			// A replay still answers while the quota is full.
			op, created, err := b.svc.Submit(ctx, admin, last)
			require.NoError(t, err)
			require.False(t, created)
			require.NotEmpty(t, op.ID)
			// Another node is not affected.
			_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Operation: json.RawMessage(`{"node":"n-other"}`)})
			require.NoError(t, err)
		})
		t.Run("PerPackageHostButNotAdmins", func(t *testing.T) {
			b2 := newLedger(t, b.db, b.tk, b.clock, func(s *ledger.Settings) { s.PackageHostQuota = 3 })
			h := host("h-quota", "test")
			for range 3 {
				b2.submit(t, h, "test.noop", `{}`)
			}
			_, _, err := b2.svc.Submit(ctx, h, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop"})
			requireCode(t, err, errcode.QuotaExceeded)
			// A replay still answers while the quota is full.
			last := ledger.Submission{RequestID: "h-quota-last", Kind: "test.noop"}
			b3 := newLedger(t, b.db, b.tk, b.clock, func(s *ledger.Settings) { s.PackageHostQuota = 4 })
			_, _, err = b3.svc.Submit(ctx, h, last)
			require.NoError(t, err)
			_, created, err := b2.svc.Submit(ctx, h, last)
			require.NoError(t, err)
			require.False(t, created)
			for range 4 {
				b2.submit(t, admin, "test.noop", `{}`)
			}
		})
	})
}

func TestDispatcher(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		t.Run("RunsToSuccessWithEvents", func(t *testing.T) {
			op := b.submit(t, admin, "test.noop", `{}`)
			done := b.waitState(t, op.ID, ledger.StateSucceeded)
			require.JSONEq(t, `{"ok":true}`, string(done.Result))
			require.Equal(t, 1, done.Attempt)
			require.NotNil(t, done.AcceptedAt)
			require.NotNil(t, done.FinishedAt)
			require.Equal(t, []string{"submitted", "running", "succeeded"}, eventTypes(t, b, op.ID))
			require.Equal(t, int64(1), b.tk.count(op.ID))
		})
		t.Run("TransactionalKind", func(t *testing.T) {
			op := b.submit(t, admin, "test.tx", `{}`)
			done := b.waitState(t, op.ID, ledger.StateSucceeded)
			require.JSONEq(t, `{"tx":true}`, string(done.Result))
		})
		t.Run("FailureCarriesCode", func(t *testing.T) {
			op := b.submit(t, admin, "test.fail", `{}`)
			done := b.waitState(t, op.ID, ledger.StateFailed)
			require.Equal(t, &ledger.Error{Code: "node_not_ready", Message: "not today"}, done.Error)
		})
		t.Run("SubmitWaitsForTheEnd", func(t *testing.T) {
			op, created, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Wait: 20 * time.Second})
			require.NoError(t, err)
			require.True(t, created)
			require.Equal(t, ledger.StateSucceeded, op.State)
		})
		t.Run("CancelRunning", func(t *testing.T) {
			op := b.submit(t, admin, "test.block", `{}`)
			b.waitState(t, op.ID, ledger.StateRunning)
			got, err := b.svc.Cancel(ctx, admin, op.ID, "changed my mind")
			require.NoError(t, err)
			require.NotNil(t, got.CancelRequestedAt)
			done := b.waitState(t, op.ID, ledger.StateCancelled)
			require.Equal(t, "changed my mind", done.CancelReason)
			require.Equal(t, []string{"submitted", "running", "cancel_requested", "cancelled"}, eventTypes(t, b, op.ID))
			again, err := b.svc.Cancel(ctx, admin, op.ID, "again")
			require.NoError(t, err)
			require.Equal(t, ledger.StateCancelled, again.State)
			require.Equal(t, "changed my mind", again.CancelReason, "an ended operation never changes")
		})
	})
}

func TestDeadline(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		op := b.submit(t, admin, "test.block", `{}`)
		done := b.waitState(t, op.ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeTimedOut, done.Error.Code)
		require.True(t, done.Error.Retryable)
	}, func(s *ledger.Settings) { s.Deadline = 100 * time.Millisecond })
}

func TestCancelPendingEndsAtOnce(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		op := b.submit(t, admin, "test.noop", `{}`) // no dispatcher runs
		got, err := b.svc.Cancel(ctx, admin, op.ID, "")
		require.NoError(t, err)
		require.Equal(t, ledger.StateCancelled, got.State)
		require.Equal(t, "cancelled", got.Error.Code)
		b.start(t)
		require.Never(t, func() bool { return b.tk.count(op.ID) > 0 }, 200*time.Millisecond, 20*time.Millisecond)
		_, err = b.svc.Cancel(ctx, host("h-x", "test"), op.ID, "")
		requireCode(t, err, errcode.NotFound)
	})
}

func TestPackageHostsSeeTheirOwn(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		h1, h2 := host("h1", "test"), host("h2", "test")
		op1 := b.submit(t, h1, "test.noop", `{}`)
		op2 := b.submit(t, h2, "test.noop", `{}`)
		_, err := b.svc.Get(ctx, h1, op2.ID)
		requireCode(t, err, errcode.NotFound)
		got, err := b.svc.Get(ctx, admin, op2.ID)
		require.NoError(t, err)
		require.Equal(t, op2.ID, got.ID)
		list, err := b.svc.List(ctx, h1, ledger.Filter{})
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, op1.ID, list[0].ID)
		list, err = b.svc.List(ctx, h1, ledger.Filter{PrincipalKind: ledger.PrincipalPackageHost, PrincipalID: "h2"})
		require.NoError(t, err)
		require.Len(t, list, 1, "a package host's filter is its own, whatever it asks")
		require.Equal(t, op1.ID, list[0].ID)
	})
}

func TestRecovery(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		// A replica claims work and dies without a word (its lease lapses).
		dead := newLedger(t, b.db, b.tk, b.clock, func(s *ledger.Settings) { s.OwnerLease = time.Second })
		ops := map[string]ledger.Operation{}
		for _, k := range []string{"test.noop", "test.tx", "test.level"} {
			ops[k] = b.submit(t, admin, k, `{}`)
		}
		claimed, err := b.store.Claim(ctx, dead.replica, b.clock.Now(), 10)
		require.NoError(t, err)
		require.Len(t, claimed, 3)
		require.NoError(t, b.store.RenewOwner(ctx, dead.replica, b.clock.Now().Add(-time.Second)))

		b.start(t)
		// Not level-triggered: interrupted, retryable.
		noop := b.waitState(t, ops["test.noop"].ID, ledger.StateFailed)
		require.Equal(t, ledger.CodeInterrupted, noop.Error.Code)
		require.True(t, noop.Error.Retryable)
		require.Zero(t, b.tk.count(noop.ID))
		// Safe to repeat: run again.
		for _, k := range []string{"test.tx", "test.level"} {
			done := b.waitState(t, ops[k].ID, ledger.StateSucceeded)
			require.Equal(t, 2, done.Attempt)
			require.Equal(t, int64(1), b.tk.count(done.ID))
			require.Contains(t, eventTypes(t, b, done.ID), ledger.EventRecovered)
		}
	})
}

func TestRecoveryLeavesLiveOwnersAlone(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		live := newLedger(t, b.db, b.tk, b.clock)
		op := b.submit(t, admin, "test.noop", `{}`)
		_, err := b.store.Claim(ctx, live.replica, b.clock.Now(), 10)
		require.NoError(t, err)
		require.NoError(t, b.store.RenewOwner(ctx, live.replica, b.clock.Now().Add(time.Hour)))
		orphans, err := b.store.Orphans(ctx, b.replica, b.clock.Now(), 10)
		require.NoError(t, err)
		require.Empty(t, orphans)
		b.clock.Advance(2 * time.Hour)
		orphans, err = b.store.Orphans(ctx, b.replica, b.clock.Now(), 10)
		require.NoError(t, err)
		require.Len(t, orphans, 1)
		require.Equal(t, op.ID, orphans[0].ID)
	})
}

// TestRecoveryOfThisReplicasEarlierProcess: a replica restarted under its
// name (ledger.Options.Predecessors) takes over at once what an earlier
// process of that name left running, without waiting out its owner lease;
// another replica's live lease is left alone.
func TestRecoveryOfThisReplicasEarlierProcess(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour }
	each(t, func(t *testing.T, b *bundle) {
		mine := b.submit(t, admin, "test.level", `{}`)
		theirs := b.submit(t, admin, "test.level", `{}`)
		for _, owner := range []string{"east/1111", "west/2222"} {
			claimed, err := b.store.Claim(ctx, owner, b.clock.Now(), 1)
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			require.NoError(t, b.store.RenewOwner(ctx, owner, b.clock.Now().Add(time.Hour)))
		}

		next := newLedgerAs(t, b.db, b.tk, b.clock, nil, "east/3333", "east/", hour)
		next.start(t)
		done := next.waitState(t, mine.ID, ledger.StateSucceeded)
		require.Equal(t, 2, done.Attempt)
		require.Contains(t, eventTypes(t, next, mine.ID), ledger.EventRecovered)
		other, err := b.store.Operation(ctx, theirs.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.StateRunning, other.State, "another replica's run, its lease current")
		require.Equal(t, "west/2222", other.Owner)
	}, hour)
}

// TestTakeOverRecoversBeforeRun: TakeOver by itself, before any
// dispatcher runs (the server calls it before it answers a request), hands
// what an earlier process of this replica left running back to pending;
// Run then runs it once more.
func TestTakeOverRecoversBeforeRun(t *testing.T) {
	hour := func(s *ledger.Settings) { s.OwnerLease = time.Hour }
	each(t, func(t *testing.T, b *bundle) {
		op := b.submit(t, admin, "test.level", `{}`)
		claimed, err := b.store.Claim(ctx, "east/1111", b.clock.Now(), 1)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.NoError(t, b.store.RenewOwner(ctx, "east/1111", b.clock.Now().Add(time.Hour)))

		next := newLedgerAs(t, b.db, b.tk, b.clock, nil, "east/3333", "east/", hour)
		next.svc.TakeOver(ctx)
		got, err := b.store.Operation(ctx, op.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.StatePending, got.State, "recovered by TakeOver, before Run")
		require.Empty(t, got.Owner)
		require.Contains(t, eventTypes(t, next, op.ID), ledger.EventRecovered)
		require.Zero(t, b.tk.count(op.ID), "nothing ran it yet")

		next.start(t)
		done := next.waitState(t, op.ID, ledger.StateSucceeded)
		require.Equal(t, 2, done.Attempt)
		require.Equal(t, int64(1), b.tk.count(op.ID))
	}, hour)
}

// TestTwoReplicasNeverRunOneOperationTwice runs many operations through two
// dispatchers sharing one database and counts executions.
func TestTwoReplicasNeverRunOneOperationTwice(t *testing.T) {
	each(t, func(t *testing.T, a *bundle) {
		b := newLedger(t, a.db, a.tk, a.clock)
		// Each replica hears the other's commits as Postgres NOTIFY would.
		a.start(t)
		b.start(t)
		const n = 600
		ids := make([]string, 0, n)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				svc := a
				if w%2 == 1 {
					svc = b
				}
				for range n / 6 {
					op, _, err := svc.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop"})
					require.NoError(t, err)
					mu.Lock()
					ids = append(ids, op.ID)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for _, id := range ids {
			a.waitState(t, id, ledger.StateSucceeded)
		}
		for _, id := range ids {
			require.Equal(t, int64(1), a.tk.count(id), "operation %s ran more than once", id)
		}
		byOwner := map[string]int{}
		list, err := a.store.List(ctx, ledger.Filter{Kind: "test.noop", Limit: 1000})
		require.NoError(t, err)
		for _, op := range list {
			byOwner[op.Owner]++
		}
		t.Logf("operations per replica: %v", byOwner)
	}, func(s *ledger.Settings) { s.Workers = 4 })
}

func TestListing(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		var all []string
		const n = 2000
		for i := range n {
			kind := "test.noop"
			if i%5 == 0 {
				kind = "test.fail"
			}
			all = append(all, b.submit(t, admin, kind, `{"i":`+strconv.Itoa(i)+`}`).ID)
		}
		// Newest first, pages without gaps or repeats.
		var seen []string
		f := ledger.Filter{Limit: 150}
		for {
			page, err := b.svc.List(ctx, admin, f)
			require.NoError(t, err)
			for _, op := range page {
				seen = append(seen, op.ID)
			}
			if len(page) < f.Limit {
				break
			}
			f.Before = page[len(page)-1].Cursor
		}
		require.Len(t, seen, len(all))
		for i := range all {
			require.Equal(t, all[len(all)-1-i], seen[i])
		}
		fails, err := b.svc.List(ctx, admin, ledger.Filter{Kind: "test.fail", Limit: 500})
		require.NoError(t, err)
		require.Len(t, fails, 400)
		pending, err := b.svc.List(ctx, admin, ledger.Filter{State: ledger.StatePending, Family: "test", Limit: 500})
		require.NoError(t, err)
		require.Len(t, pending, 500, "a full page")
		one, err := b.svc.List(ctx, admin, ledger.Filter{OperationID: all[7]})
		require.NoError(t, err)
		require.Len(t, one, 1)
	})
}

func TestNodeKinds(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		sub := ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite, Wait: 20 * time.Second,
			Operation: json.RawMessage(`{"rental_id":"rack-1","generation":1,"shadow_price_usd_per_hour":0.5}`)}
		op, created, err := b.svc.Submit(ctx, admin, sub)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, ledger.StateSucceeded, op.State, "error: %+v", op.Error)
		var res ledger.BootstrapResult
		require.NoError(t, json.Unmarshal(op.Result, &res))
		require.Equal(t, op.TargetID, res.NodeID, "the node id was fixed at submit")
		require.NotContains(t, string(op.Result), "enrollment_token")
		n, err := b.fleet.Node(ctx, res.NodeID)
		require.NoError(t, err)
		require.Equal(t, fleet.StateEnrolling, n.State)

		// The same identity again is refused at submit; nothing recorded.
		before := countOps(t, b)
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite,
			Operation: json.RawMessage(`{"rental_id":"rack-1","generation":1}`)})
		requireCode(t, err, errcode.IdentityExists)
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeInvite,
			Operation: json.RawMessage(`{"rental_id":"rack-1","generation":1,"surprise":true}`)})
		requireCode(t, err, errcode.InvalidJSON)
		require.Equal(t, before, countOps(t, b))

		target := []ledger.Target{{Kind: ledger.TargetNode, ID: res.NodeID}}
		re, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeReinvite,
			Targets: target, Wait: 20 * time.Second})
		require.NoError(t, err)
		require.Equal(t, ledger.StateSucceeded, re.State, "error: %+v", re.Error)

		ret, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeRetire,
			Targets: target, Operation: json.RawMessage(`{"reason":"decommissioned"}`), Wait: 20 * time.Second})
		require.NoError(t, err)
		require.Equal(t, ledger.StateSucceeded, ret.State, "error: %+v", ret.Error)
		n, err = b.fleet.Node(ctx, res.NodeID)
		require.NoError(t, err)
		require.Equal(t, fleet.StateRetired, n.State)

		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeReinvite, Targets: target})
		requireCode(t, err, errcode.NodeRetired)
		_, _, err = b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: ledger.KindNodeRetire,
			Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "nope"}}})
		requireCode(t, err, errcode.NotFound)
	})
}

func TestPrune(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		b.start(t)
		old := b.submit(t, admin, "test.noop", `{}`)
		b.waitState(t, old.ID, ledger.StateSucceeded)
		open := b.submit(t, admin, "test.block", `{}`)
		b.waitStarted(t, open.ID)
		b.clock.Advance(91 * 24 * time.Hour)
		recent := b.submit(t, admin, "test.noop", `{}`)
		b.waitState(t, recent.ID, ledger.StateSucceeded)
		ops, events, err := b.svc.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, ops)
		require.Positive(t, events)
		_, err = b.store.Operation(ctx, old.ID)
		require.ErrorIs(t, err, ledger.ErrNoRows)
		_, err = b.store.Operation(ctx, open.ID)
		require.NoError(t, err, "open operations are never pruned")
		_, err = b.store.Operation(ctx, recent.ID)
		require.NoError(t, err)
		require.Len(t, eventTypes(t, b, recent.ID), 3, "recent events are kept")
		close(b.tk.release)
	})
}

// TestClaimIsNeverStampedBeforeTheSubmission: the dispatcher reads its
// clock before its claim sees the queue, so an operation submitted in
// between is claimed with an earlier time; the claim is stamped at the
// submission instead (a running event before its submitted event would be
// pruned as older than it is, TestPrune's flake).
func TestClaimIsNeverStampedBeforeTheSubmission(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		read := b.clock.Now() // the dispatcher's reading, before the submit
		b.clock.Advance(time.Hour)
		op := b.submit(t, admin, "test.noop", `{}`)
		claimed, err := b.store.Claim(ctx, b.replica, read, 10)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		got := claimed[0]
		require.Equal(t, op.ID, got.ID)
		require.Equal(t, op.CreatedAt, got.UpdatedAt, "stamped at its submission, not before")
		require.NotNil(t, got.AcceptedAt)
		require.Equal(t, op.CreatedAt, *got.AcceptedAt)
		evs, err := b.store.Events(ctx, op.ID, 0, 10)
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.Equal(t, ledger.EventRunning, evs[1].Type)
		require.False(t, evs[1].At.Before(evs[0].At), "running %v before submitted %v", evs[1].At, evs[0].At)
		require.Equal(t, op.CreatedAt, evs[1].At.UTC())

		// A claim read after the submission is stamped when it was read.
		later := b.clock.Now().Add(time.Minute)
		again := b.submit(t, admin, "test.noop", `{}`)
		claimed, err = b.store.Claim(ctx, b.replica, later, 10)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, again.ID, claimed[0].ID)
		require.Equal(t, dbtime.Norm(later), claimed[0].UpdatedAt)
	})
}

func TestDrainAnswersWaitingSubmits(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		// No dispatcher runs: the operation stays pending, the submit waits.
		type answer struct {
			op  ledger.Operation
			err error
		}
		got := make(chan answer, 1)
		go func() {
			op, _, err := b.svc.Submit(ctx, admin, ledger.Submission{RequestID: newRequestID(), Kind: "test.noop", Wait: time.Minute})
			got <- answer{op, err}
		}()
		require.Eventually(t, func() bool { return countOps(t, b) == 1 }, waitLong, tick)
		b.svc.Drain()
		select {
		case a := <-got:
			require.NoError(t, a.err)
			require.Equal(t, ledger.StatePending, a.op.State, "answered at once, as it stands")
		case <-time.After(waitLong):
			t.Fatal("drain did not answer the waiting submit")
		}
	})
}

// A cancel heard after a claim committed but before its run started (the
// window between the claim's statement and the run registering here) is
// not lost: the run starts cancelled instead of running to its deadline.
func TestCancelHeardBetweenClaimAndRun(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		op := b.submit(t, admin, "test.block", `{}`)
		claimed, err := b.svc.ClaimForTest(ctx, 1)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, op.ID, claimed[0].ID)
		require.Nil(t, claimed[0].CancelRequestedAt, "claimed before the cancel")

		_, err = b.svc.Cancel(ctx, admin, op.ID, "before it started")
		require.NoError(t, err)
		b.svc.Changed(ctx, op.ID) // as another replica's notification would
		require.Equal(t, 1, b.svc.HeardForTest())

		returned := make(chan struct{})
		go func() { defer close(returned); b.svc.ExecuteForTest(ctx, claimed[0]) }()
		select {
		case <-returned:
		case <-time.After(waitLong):
			close(b.tk.release)
			<-returned
			t.Fatal("the run did not see the cancel heard before it started")
		}
		done := b.op(t, op.ID)
		require.Equal(t, ledger.StateCancelled, done.State)
		require.Equal(t, "before it started", done.CancelReason)
		require.Equal(t, 0, b.svc.HeardForTest(), "nothing kept once no claim is unstarted")
	})
}
