package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testclock"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// clock is the tests' settable clock.
type clock = testclock.Clock

var ctx = context.Background()

// testKinds are kinds only tests serve: a no-op, one that blocks until
// released or cancelled, one that fails, and a fan-out of no-ops.
type testKinds struct {
	runs    sync.Map // operation id → *atomic.Int64 (executions)
	release chan struct{}
	started chan string
}

func (k *testKinds) count(id string) int64 {
	v, _ := k.runs.LoadOrStore(id, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

func (k *testKinds) ran(id string) {
	v, _ := k.runs.LoadOrStore(id, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func prepareAny(_ context.Context, d *ledger.Draft) error {
	var body struct {
		Node string `json:"node"`
		Fail bool   `json:"fail"`
	}
	if err := json.Unmarshal(d.Operation, &body); err != nil {
		return errcode.New(errcode.ValidationFailed, "bad operation")
	}
	if body.Fail {
		return errcode.New(errcode.ValidationFailed, "preparer refused")
	}
	if body.Node != "" {
		d.Targets = []ledger.Target{{Kind: ledger.TargetNode, ID: body.Node}}
	}
	return nil
}

func (k *testKinds) kinds() []*ledger.Kind {
	return []*ledger.Kind{
		{Name: "test.noop", Family: "test", Prepare: prepareAny,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				k.ran(op.ID)
				return json.RawMessage(`{"ok":true}`), nil
			}},
		{Name: "test.tx", Family: "test", Prepare: prepareAny,
			RunTx: func(ctx context.Context, tx ledger.Tx, op ledger.Operation) (json.RawMessage, error) {
				k.ran(op.ID)
				return json.RawMessage(`{"tx":true}`), nil
			}},
		{Name: "test.block", Family: "test", Prepare: prepareAny,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				k.ran(op.ID)
				select {
				case k.started <- op.ID:
				default:
				}
				select {
				case <-k.release:
					return nil, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}},
		{Name: "test.fail", Family: "test", Prepare: prepareAny,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				k.ran(op.ID)
				return nil, errcode.New(errcode.NodeNotReady, "not today")
			}},
		{Name: "test.fan", Family: "test", Prepare: prepareAny,
			FanOut: func(ctx context.Context, tx ledger.Tx, op ledger.Operation) (ledger.Plan, error) {
				var body struct {
					Children       int    `json:"children"`
					MaxConcurrency int    `json:"max_concurrency"`
					Child          string `json:"child"`
				}
				if err := json.Unmarshal(op.Operation, &body); err != nil {
					return ledger.Plan{}, err
				}
				plan := ledger.Plan{MaxConcurrency: body.MaxConcurrency}
				childKind := "test.noop"
				if body.Child != "" {
					childKind = body.Child
				}
				for range body.Children {
					plan.Children = append(plan.Children, ledger.Child{Kind: childKind, Targets: []ledger.Target{}, Operation: json.RawMessage(`{}`)})
				}
				return plan, nil
			}},
		{Name: "test.level", Family: "test", LevelTriggered: true, Prepare: prepareAny,
			Run: func(ctx context.Context, op ledger.Operation) (json.RawMessage, error) {
				k.ran(op.ID)
				return nil, nil
			}},
	}
}

type bundle struct {
	db      *models.DB
	fstore  *models.FleetStore
	store   *models.LedgerStore
	fleet   *fleet.Service
	svc     *ledger.Service
	clock   *clock
	metrics *metrics.Metrics
	tk      *testKinds
	replica string
	stop    func()
	wrap    func(ledger.Store) ledger.Store
}

var replicaN atomic.Int64

// newLedger builds a ledger (not started) over db, as replica name.
func newLedger(t *testing.T, db *models.DB, tk *testKinds, c *clock, mutate ...func(*ledger.Settings)) *bundle {
	t.Helper()
	return newLedgerWrapped(t, db, tk, c, nil, mutate...)
}

// newLedgerWrapped is newLedger whose service sees its store through wrap
// (to count what it asks of it); b.store stays the store itself.
func newLedgerWrapped(t *testing.T, db *models.DB, tk *testKinds, c *clock, wrap func(ledger.Store) ledger.Store,
	mutate ...func(*ledger.Settings)) *bundle {
	t.Helper()
	return newLedgerAs(t, db, tk, c, wrap, "replica-"+strconv.FormatInt(replicaN.Add(1), 10), "", mutate...)
}

// newLedgerAs is newLedgerWrapped owning what it runs as replica, with
// ledger.Options.Predecessors.
func newLedgerAs(t *testing.T, db *models.DB, tk *testKinds, c *clock, wrap func(ledger.Store) ledger.Store,
	replica, predecessors string, mutate ...func(*ledger.Settings)) *bundle {
	t.Helper()
	b := &bundle{db: db, clock: c, metrics: metrics.New(nil), tk: tk, wrap: wrap, replica: replica}
	b.fstore = models.NewFleetStore(db, b.replica, nil)
	b.fleet = fleet.New(fleet.Options{Store: b.fstore, Keys: keys.NewRing(bytes.Repeat([]byte{7}, 32)), Now: c.Now, Metrics: b.metrics,
		Settings: fleet.Settings{PublicURL: "https://cp.example", ReplicaID: b.replica}, Logger: slog.New(slog.DiscardHandler)})
	b.store = models.NewLedgerStore(b.fstore)
	st := ledger.Settings{FallbackPoll: 50 * time.Millisecond, SingleProcess: false}
	for _, m := range mutate {
		m(&st)
	}
	var store ledger.Store = b.store
	if b.wrap != nil {
		store = b.wrap(store)
	}
	kinds := append(tk.kinds(), ledger.ServedKinds(b.fleet)...)
	reg := ledger.NewRegistry(append(kinds, ledger.ConfigKinds(b.fleet, nil)...)...)
	b.svc = ledger.New(ledger.Options{Store: store, Kinds: reg, Settings: st, Replica: b.replica, Predecessors: predecessors, Now: c.Now,
		Metrics: b.metrics, Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		CrossReplica: db.Dialect == models.Postgres, RequireCapability: b.fleet.RequireCapability})
	b.fstore.SetOnCommit(func(notes []fleet.Notification) {
		b.fleet.Deliver(notes, "local")
		for _, n := range notes {
			switch n.Kind {
			case fleet.NotifyOperation:
				b.svc.Changed(ctx, n.NodeID)
			case fleet.NotifyChildEnded:
				b.svc.ChildEnded(n.NodeID)
			case fleet.NotifyDispatch:
				b.svc.Dispatchable(n.NodeID)
			}
		}
	})
	return b
}

// start runs the ledger's background work until the test ends (or stop).
func (b *bundle) start(t *testing.T) {
	t.Helper()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.svc.Run(runCtx) }()
	var once sync.Once
	b.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(b.stop)
}

func newTestKinds() *testKinds {
	return &testKinds{release: make(chan struct{}), started: make(chan string, 64)}
}

func newClock() *clock { return testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

// each runs fn on a fresh ledger over every dialect.
func each(t *testing.T, fn func(t *testing.T, b *bundle), mutate ...func(*ledger.Settings)) {
	t.Helper()
	dbtest.Each(t, func(t *testing.T, db *models.DB) { fn(t, newLedger(t, db, newTestKinds(), newClock(), mutate...)) })
}

var admin = ledger.Principal{Kind: ledger.PrincipalAdmin, ID: "u1", Name: "alice"}

func host(id string, families ...string) ledger.Principal {
	return ledger.Principal{Kind: ledger.PrincipalPackageHost, ID: id, Name: "host-" + id, Generation: 1, Families: families}
}

var reqN atomic.Int64

func newRequestID() string { return "req-" + strconv.FormatInt(reqN.Add(1), 10) }

func (b *bundle) submit(t *testing.T, p ledger.Principal, kind string, op string) ledger.Operation {
	t.Helper()
	got, created, err := b.svc.Submit(ctx, p, ledger.Submission{RequestID: newRequestID(), Kind: kind, Operation: json.RawMessage(op)})
	require.NoError(t, err)
	require.True(t, created)
	return got
}

// waitState waits (generously) until the operation is in state.
func (b *bundle) waitState(t *testing.T, id string, state ledger.State) ledger.Operation {
	t.Helper()
	var op ledger.Operation
	require.Eventually(t, func() bool {
		var err error
		op, err = b.store.Operation(ctx, id)
		require.NoError(t, err)
		return op.State == state
	}, 20*time.Second, 5*time.Millisecond, "operation %s never reached %s", id, state)
	return op
}

// waitStarted waits until the executor of id (a test.block) has started,
// so its deadline was taken before a test moves the clock: an operation
// merely claimed (running in the store) takes its deadline when its run
// begins, and a clock advanced past it first ends it timed_out.
func (b *bundle) waitStarted(t *testing.T, id string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case got := <-b.tk.started:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("the executor of %s never started", id)
		}
	}
}

func countOps(t *testing.T, b *bundle) int64 {
	t.Helper()
	return dbtest.Count(t, b.db.DB, &models.Operation{})
}

func requireCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	require.Error(t, err)
	var e *errcode.Error
	require.True(t, errors.As(err, &e), "not a coded error: %v", err)
	require.Equal(t, code, e.Code, "got %v", err)
}

func eventTypes(t *testing.T, b *bundle, id string) []string {
	t.Helper()
	evs, err := b.store.Events(ctx, id, 0, 100)
	require.NoError(t, err)
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// testLog writes the ledger's warnings and errors to the test's log, so a
// failure shows what the dispatcher saw.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}
