package secrets_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/testclock"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

// clock is the tests' settable clock.
type clock = testclock.Clock

var (
	ctx     = context.Background()
	masterA = bytes.Repeat([]byte{0xA}, 32)
	masterB = bytes.Repeat([]byte{0xB}, 32)
	admin   = secrets.Principal{Kind: "admin", ID: "u1"}
	node1   = secrets.Target{Kind: secrets.TargetNode, ID: "n1"}
)

type fixture struct {
	svc   *secrets.Service
	store *models.SecretsStore
	db    *models.DB
	clock *clock
}

func setup(t *testing.T, db *models.DB, ring *keys.Ring) fixture {
	c := testclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	st := models.NewSecretsStore(db)
	return fixture{svc: secrets.New(secrets.Options{Store: st, Keys: ring, Now: c.Now, MaxLive: 5}), store: st, db: db, clock: c}
}

func (f fixture) seal(t *testing.T, p secrets.Principal, req string, target secrets.Target, field, value string) string {
	t.Helper()
	rc, err := f.svc.Seal(ctx, p, secrets.SealRequest{RequestID: req, Target: target, Field: field, Value: value})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(rc.Handle, secrets.HandlePrefix))
	return rc.Handle
}

func envOp(handle string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"run_id": "r", "attempt_id": "a", "command": "x", "env": map[string]string{"DB_PASSWORD": handle}})
	return b
}

// resolve runs Resolve in a transaction of its own, rolled back when it is
// refused, and audits a refusal as the ledger does.
func (f fixture) resolve(u secrets.Use) (map[string]string, error) {
	var out map[string]string
	err := f.store.Tx(ctx, func(tx secrets.Tx) error {
		var err error
		out, err = f.svc.Resolve(ctx, tx, u)
		return err
	})
	f.svc.RecordDenial(ctx, err)
	return out, err
}

func use(p secrets.Principal, req, op string, target secrets.Target, operation json.RawMessage) secrets.Use {
	return secrets.Use{Principal: p, RequestID: req, OperationID: op, Target: target, Operation: operation}
}

func usedCount(t *testing.T, db *models.DB) int64 {
	return dbtest.Count(t, db.DB, &models.SealedSecret{}, "state = ?", "used")
}

func TestResolveRoundTripAndDelivery(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		h := f.seal(t, admin, "req-1", node1, "/env/DB_PASSWORD", "hunter2")
		got, err := f.resolve(use(admin, "req-1", "op-1", node1, envOp(h)))
		require.NoError(t, err)
		require.Equal(t, map[string]string{"/env/DB_PASSWORD": "hunter2"}, got)

		delivered, err := f.svc.Deliver(ctx, "op-1", "", envOp(h))
		require.NoError(t, err)
		var body struct{ Env map[string]string }
		require.NoError(t, json.Unmarshal(delivered, &body))
		require.Equal(t, "hunter2", body.Env["DB_PASSWORD"])
		other, err := f.svc.Deliver(ctx, "op-2", "", envOp(h))
		require.NoError(t, err)
		require.JSONEq(t, string(envOp(h)), string(other), "another operation's payload is answered as it is")

		audit, err := f.svc.Audit(ctx, secrets.AuditFilter{Limit: 10})
		require.NoError(t, err)
		require.Len(t, audit, 2)
		require.Equal(t, secrets.ActionUse, audit[0].Action)
		require.Equal(t, secrets.OutcomeOK, audit[0].Outcome)
		require.Equal(t, "op-1", audit[0].OperationID)
		require.Equal(t, secrets.Digest(h)[:16], audit[0].HandleDigest)
		require.Equal(t, secrets.ActionSeal, audit[1].Action)
	})
}

func TestResolveDenials(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		host := secrets.Principal{Kind: "package_host", ID: "h1"}
		fresh := func() string { return f.seal(t, admin, "req-1", node1, "/env/DB_PASSWORD", "hunter2") }
		cases := []struct {
			name   string
			handle func() string
			use    func(h string) secrets.Use
		}{
			{"other principal", fresh, func(h string) secrets.Use { return use(host, "req-1", "op", node1, envOp(h)) }},
			{"other request id", fresh, func(h string) secrets.Use { return use(admin, "req-2", "op", node1, envOp(h)) }},
			{"other target", fresh, func(h string) secrets.Use {
				return use(admin, "req-1", "op", secrets.Target{Kind: "node", ID: "n2"}, envOp(h))
			}},
			{"other field", func() string { return f.seal(t, admin, "req-1", node1, "/env/OTHER", "hunter2") },
				func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
			{"fleet handle outside a fan-out", func() string {
				return f.seal(t, admin, "req-1", secrets.Target{Kind: "fleet"}, "/env/DB_PASSWORD", "hunter2")
			}, func(h string) secrets.Use { return use(admin, "req-1", "op", secrets.Target{Kind: "fleet"}, envOp(h)) }},
			{"reused", func() string {
				h := fresh()
				_, err := f.resolve(use(admin, "req-1", "first", node1, envOp(h)))
				require.NoError(t, err)
				return h
			}, func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
			{"expired", func() string {
				h := fresh()
				f.clock.Advance(secrets.DefaultTTL)
				return h
			}, func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
			{"tampered", func() string {
				h := []byte(fresh())
				h[len(h)-2] ^= 1
				return string(h)
			}, func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
			{"malformed", func() string { return secrets.HandlePrefix + "short" },
				func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
			{"another key", func() string {
				// Sealed by a server whose master key this one never had.
				other := setup(t, db, keys.NewRing(masterB))
				other.clock.Set(f.clock.Now())
				return other.seal(t, admin, "req-1", node1, "/env/DB_PASSWORD", "hunter2")
			}, func(h string) secrets.Use { return use(admin, "req-1", "op", node1, envOp(h)) }},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				h := tc.handle()
				used := usedCount(t, db)
				_, err := f.resolve(tc.use(h))
				require.Equal(t, errcode.PermissionDenied, errcode.Of(err))
				require.NotContains(t, err.Error(), secrets.HandlePrefix, "the message names no handle")
				require.NotContains(t, err.Error(), "hunter2")
				var d *secrets.Denied
				require.True(t, errors.As(err, &d))
				require.Equal(t, used, usedCount(t, db), "nothing marked used")
				_, err = f.resolve(tc.use(h))
				require.Error(t, err)
				audit, err := f.svc.Audit(ctx, secrets.AuditFilter{Limit: 1})
				require.NoError(t, err)
				require.Equal(t, secrets.OutcomeDenied, audit[0].Outcome, "the denial is audited")
				require.Equal(t, secrets.Digest(h)[:16], audit[0].HandleDigest)
				f.clock.Set(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
				_, err = f.store.Purge(ctx, f.clock.Now().Add(48*time.Hour), 1000) // the quota is small
				require.NoError(t, err)
			})
		}
	})
}

func TestResolveAllOrNone(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		good := f.seal(t, admin, "req-1", node1, "/env/A", "one")
		bad := f.seal(t, admin, "req-1", node1, "/env/ELSEWHERE", "two")
		op, _ := json.Marshal(map[string]any{"env": map[string]string{"A": good, "B": bad}})
		_, err := f.resolve(use(admin, "req-1", "op", node1, op))
		require.Equal(t, errcode.PermissionDenied, errcode.Of(err))
		require.Zero(t, usedCount(t, db), "the good handle is not spent by a refused operation")
		require.Zero(t, dbtest.Count(t, db.DB, &models.SecretDelivery{}))
	})
}

func TestResolveConcurrentUseOneWins(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		h := f.seal(t, admin, "req-1", node1, "/env/DB_PASSWORD", "hunter2")
		var wg sync.WaitGroup
		var won, denied atomic.Int64
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := f.resolve(use(admin, "req-1", "op-"+string(rune('a'+i)), node1, envOp(h)))
				switch {
				case err == nil:
					won.Add(1)
				case errcode.Of(err) == errcode.PermissionDenied:
					denied.Add(1)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, int64(1), won.Load())
		require.Equal(t, int64(5), denied.Load())
		require.Equal(t, int64(1), dbtest.Count(t, db.DB, &models.SecretDelivery{}))
	})
}

func TestRotationKeepsValuesReadable(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		h := f.seal(t, admin, "req-1", node1, "/env/DB_PASSWORD", "hunter2")
		rotated := setup(t, db, keys.NewRing(masterB, masterA))
		rotated.clock.Set(f.clock.Now())
		got, err := rotated.resolve(use(admin, "req-1", "op-1", node1, envOp(h)))
		require.NoError(t, err)
		require.Equal(t, "hunter2", got["/env/DB_PASSWORD"])
	})
}

func TestSealValidationAndQuota(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		ok := secrets.SealRequest{RequestID: "req-1", Target: node1, Field: "/env/A", Value: "v"}
		for name, tc := range map[string]struct {
			mutate func(*secrets.SealRequest)
			field  string
		}{
			"empty value":     {func(r *secrets.SealRequest) { r.Value = "" }, "value"},
			"oversized value": {func(r *secrets.SealRequest) { r.Value = strings.Repeat("x", secrets.MaxValueSize+1) }, "value"},
			"bad pointer":     {func(r *secrets.SealRequest) { r.Field = "/env/~2" }, "field"},
			"relative field":  {func(r *secrets.SealRequest) { r.Field = "env" }, "field"},
			"bad target":      {func(r *secrets.SealRequest) { r.Target = secrets.Target{Kind: "planet", ID: "x"} }, "target/kind"},
			"fleet with id":   {func(r *secrets.SealRequest) { r.Target = secrets.Target{Kind: "fleet", ID: "x"} }, "target/id"},
			"endpoint no URL": {func(r *secrets.SealRequest) { r.Target = secrets.Target{Kind: "endpoint", ID: "nope"} }, "target/id"},
			"bad request id":  {func(r *secrets.SealRequest) { r.RequestID = "a b" }, "request_id"},
			"ttl too long":    {func(r *secrets.SealRequest) { r.TTL = 25 * time.Hour }, "ttl_seconds"},
		} {
			req := ok
			tc.mutate(&req)
			_, err := f.svc.Seal(ctx, admin, req)
			var e *errcode.Error
			require.True(t, errors.As(err, &e), name)
			require.Equal(t, errcode.ValidationFailed, e.Code, name)
			require.Equal(t, tc.field, e.Fields[0].Field, name)
		}
		require.Zero(t, dbtest.Count(t, db.DB, &models.SealedSecret{}), "nothing stored")

		for range 5 {
			_, err := f.svc.Seal(ctx, admin, ok)
			require.NoError(t, err)
		}
		_, err := f.svc.Seal(ctx, admin, ok)
		require.Equal(t, errcode.QuotaExceeded, errcode.Of(err))
		f.clock.Advance(secrets.DefaultTTL)
		n, err := f.svc.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		_, err = f.svc.Seal(ctx, admin, ok)
		require.NoError(t, err, "expired handles free the quota")
		audit, err := f.svc.Audit(ctx, secrets.AuditFilter{Limit: 2})
		require.NoError(t, err)
		require.Equal(t, secrets.ActionExpire, audit[1].Action, "the purge is audited")
	})
}
