package secrets_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
	"github.com/nodeward/nodeward/secrets"
)

// TestRevealNotReadyThenOnce: while the operation has not succeeded a
// redemption is refused (audited not_ready) and the handle stays open;
// then exactly one of concurrent redemptions gets the value.
func TestRevealNotReadyThenOnce(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *models.DB) {
		f := setup(t, db, keys.NewRing(masterA))
		var hs map[string]string
		require.NoError(t, f.store.Tx(ctx, func(tx secrets.Tx) error {
			var err error
			hs, err = f.svc.MintReveals(ctx, tx, admin, "req-1", "op-1", []string{"token"})
			return err
		}))
		h := hs["token"]
		require.True(t, strings.HasPrefix(h, secrets.RevealPrefix))
		again, err := f.svc.RevealHandles(ctx, admin, "op-1")
		require.NoError(t, err)
		require.Equal(t, hs, again)
		other, err := f.svc.RevealHandles(ctx, secrets.Principal{Kind: "package_host", ID: "h1"}, "op-1")
		require.NoError(t, err)
		require.Nil(t, other, "another principal's replay shows nothing")

		var ready atomic.Bool
		produce := func(op, field string) (string, error) {
			if !ready.Load() {
				return "", errcode.New(errcode.Conflict, "not yet")
			}
			return "value-of-" + op + "-" + field, nil
		}
		_, _, err = f.svc.Redeem(ctx, admin, h, produce)
		require.Equal(t, errcode.Conflict, errcode.Of(err))

		ready.Store(true)
		var wins atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				field, v, err := f.svc.Redeem(ctx, admin, h, produce)
				if err == nil {
					require.Equal(t, "token", field)
					require.Equal(t, "value-of-op-1-token", v)
					wins.Add(1)
					return
				}
				require.Equal(t, errcode.RevealSpent, errcode.Of(err))
			}()
		}
		wg.Wait()
		require.Equal(t, int64(1), wins.Load())

		audit, err := f.svc.Audit(ctx, secrets.AuditFilter{Limit: 100})
		require.NoError(t, err)
		outcomes := map[string]int{}
		for _, a := range audit {
			outcomes[a.Action+"/"+a.Outcome]++
			require.Equal(t, secrets.Digest(h)[:16], a.HandleDigest)
		}
		require.Equal(t, map[string]int{"reveal/not_ready": 1, "reveal/ok": 1, "reveal/spent": 7}, outcomes)
	})
}
