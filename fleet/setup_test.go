package fleet_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testclock"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// clock is the tests' settable clock.
type clock = testclock.Clock

func newClock() *clock { return testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

type bundle struct {
	db      *models.DB
	store   *models.FleetStore
	svc     *fleet.Service
	clock   *clock
	metrics *metrics.Metrics
	ring    *keys.Ring
}

var testKey = bytes.Repeat([]byte{0x42}, 32)

func setup(t *testing.T, db *models.DB, mutate ...func(*fleet.Settings)) *bundle {
	t.Helper()
	return setupWrapped(t, db, nil, mutate...)
}

// setupWrapped is setup with the service's store wrapped by wrap (nil: not
// wrapped); b.store stays the store underneath.
func setupWrapped(t *testing.T, db *models.DB, wrap func(fleet.Store) fleet.Store, mutate ...func(*fleet.Settings)) *bundle {
	t.Helper()
	b := &bundle{db: db, clock: newClock(), metrics: metrics.New(nil), ring: keys.NewRing(testKey)}
	// The memos start cold: tests count the reads that fill them.
	st := fleet.Settings{PublicURL: "https://cp.example", AgentVersion: "1.2.3", ReplicaID: "test", LeaseFlushInterval: 5 * time.Millisecond,
		SkipWarmUp: true}
	for _, m := range mutate {
		m(&st)
	}
	b.store = models.NewFleetStore(db, "test", nil)
	var store fleet.Store = b.store
	if wrap != nil {
		store = wrap(b.store)
	}
	b.svc = fleet.New(fleet.Options{Store: store, Keys: b.ring, Settings: st, Now: b.clock.Now, Metrics: b.metrics, Logger: slog.New(slog.DiscardHandler)})
	b.start(t)
	return b
}

// start hands b's commits to its service, as the server wires them, and
// runs the service until the test ends.
func (b *bundle) start(t *testing.T) {
	t.Helper()
	b.store.SetOnCommit(func(n []fleet.Notification) { b.svc.Deliver(n, "local") })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// each runs fn on a fresh fleet over every dialect.
func each(t *testing.T, fn func(t *testing.T, b *bundle), mutate ...func(*fleet.Settings)) {
	t.Helper()
	dbtest.Each(t, func(t *testing.T, db *models.DB) { fn(t, setup(t, db, mutate...)) })
}

var ctx = context.Background()

func facts(at time.Time) api.Facts {
	free := int64(10 << 30)
	return api.Facts{Hostname: "h1", OS: "linux", Arch: "amd64", CPUs: 4, MemoryBytes: 8 << 30, DiskFreeBytes: &free,
		AgentVersion: "1.2.3", Runtimes: []string{"process"}, ObservedAt: at}
}

func (b *bundle) invite(t *testing.T, in fleet.Invite) api.Bootstrap {
	t.Helper()
	if in.RentalID == "" {
		in.RentalID = "rental-" + randomSuffix()
	}
	if in.Generation == 0 {
		in.Generation = 1
	}
	boot, err := b.svc.Invite(ctx, "admin:test", in)
	require.NoError(t, err)
	return boot
}

func (b *bundle) enroll(t *testing.T, boot api.Bootstrap) api.EnrollResponse {
	t.Helper()
	resp, err := b.svc.Enroll(ctx, enrollReq(boot, b.clock.Now()))
	require.NoError(t, err)
	return resp
}

func enrollReq(boot api.Bootstrap, at time.Time) api.EnrollRequest {
	return api.EnrollRequest{NodeID: boot.NodeID, Generation: boot.Generation, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "1.2.3", Facts: facts(at)}
}

// readyNode invites and enrolls a node, answering its id and session.
func (b *bundle) readyNode(t *testing.T) (string, fleet.Session, string) {
	t.Helper()
	boot := b.invite(t, fleet.Invite{RentalID: "r-" + randomSuffix()})
	resp := b.enroll(t, boot)
	sess, err := b.svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk)
	require.NoError(t, err)
	return boot.NodeID, sess, resp.SessionToken
}

var suffixN atomic.Int64

func randomSuffix() string { return strconv.FormatInt(suffixN.Add(1), 10) }

func requireCode(t *testing.T, err error, want error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, want, "got %v", err)
}

func itoa(i int) string { return strconv.Itoa(i) }

// crossReplica builds a running fleet on db as a replica sharing its store
// with others, whose notifications may be missed until the test says they
// flow (SetNotifierHealthy). through, when set, wraps the store the service
// reads and writes through.
func crossReplica(t *testing.T, db *models.DB, name string, skipWarmUp bool, through func(*models.FleetStore) fleet.Store) *bundle {
	t.Helper()
	b := &bundle{db: db, clock: newClock(), metrics: metrics.New(nil)}
	b.store = models.NewFleetStore(db, name, nil)
	var store fleet.Store = b.store
	if through != nil {
		store = through(b.store)
	}
	b.svc = fleet.New(fleet.Options{Store: store, Keys: keys.NewRing(testKey), Now: b.clock.Now, Metrics: b.metrics, CrossReplica: true,
		Logger: slog.New(slog.DiscardHandler), Settings: fleet.Settings{PublicURL: "https://cp.example", AgentVersion: "1.2.3",
			ReplicaID: name, LeaseFlushInterval: 5 * time.Millisecond, SkipWarmUp: skipWarmUp}})
	b.start(t)
	return b
}
