package fleet_test

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// verifications answers how many session tokens were checked by their
// signature and how many answered from the session cache so far.
func verifications(m *metrics.Metrics) (signature, cached float64) {
	return testutil.ToFloat64(m.SessionVerifications.WithLabelValues("signature")),
		testutil.ToFloat64(m.SessionVerifications.WithLabelValues("cached"))
}

// requireVerifications runs fn and checks what its session checks cost.
func requireVerifications(t *testing.T, m *metrics.Metrics, signature, cached float64, msg string, fn func()) {
	t.Helper()
	s0, c0 := verifications(m)
	fn()
	s1, c1 := verifications(m)
	require.Equal(t, signature, s1-s0, "%s: signature checks", msg)
	require.Equal(t, cached, c1-c0, "%s: cached answers", msg)
}

// TestSessionCacheSkipsSignature: a token verified once is not verified
// again; a forged one is verified (and refused) every time.
func TestSessionCacheSkipsSignature(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		_, _, tok := b.readyNode(t) // its first door verified it
		requireVerifications(t, b.metrics, 0, 3, "the same token again", func() {
			requireDoor(t, b.svc, tok, fleet.DoorAsk, nil)
			requireDoor(t, b.svc, tok, fleet.DoorReport, nil)
			requireDoor(t, b.svc, tok, fleet.DoorAsk, nil)
		})
		renewed, err := b.svc.Renew(ctx, tok)
		require.NoError(t, err)
		requireVerifications(t, b.metrics, 1, 1, "a renewed token: verified once", func() {
			requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorAsk, nil)
			requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorAsk, nil)
		})
		forged := tok[:len(tok)-2] + flip(tok[len(tok)-2:])
		requireVerifications(t, b.metrics, 2, 0, "a forged token is never remembered", func() {
			requireDoor(t, b.svc, forged, fleet.DoorAsk, fleet.ErrSessionInvalid)
			requireDoor(t, b.svc, forged, fleet.DoorAsk, fleet.ErrSessionInvalid)
		})
		requireVerifications(t, b.metrics, 0, 0, "an empty token", func() {
			requireDoor(t, b.svc, "", fleet.DoorAsk, fleet.ErrSessionInvalid)
		})
	})
}

// flip changes a token's last characters (its signature).
func flip(s string) string {
	if s == "AA" {
		return "BB"
	}
	return "AA"
}

// TestSessionCacheExpiry: a remembered token is refused once Verify would
// refuse it (expiry plus the leeway, on the injected clock), then forgotten.
func TestSessionCacheExpiry(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		_, _, tok := b.readyNode(t)
		renewed, err := b.svc.Renew(ctx, tok)
		require.NoError(t, err)
		requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorAsk, nil)
		b.clock.Set(renewed.SessionExpiresAt.Add(keys.Leeway - time.Nanosecond))
		requireVerifications(t, b.metrics, 0, 1, "within the leeway", func() {
			requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorReport, nil)
		})
		b.clock.Advance(time.Nanosecond)
		requireVerifications(t, b.metrics, 0, 1, "expired, on a hit", func() {
			requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorReport, fleet.ErrSessionInvalid)
		})
		requireVerifications(t, b.metrics, 1, 0, "forgotten: verified again, refused", func() {
			requireDoor(t, b.svc, renewed.SessionToken, fleet.DoorReport, fleet.ErrSessionInvalid)
		})
	})
}

// TestSessionCacheRotation: after a rotation a token of a key the ring
// keeps is still accepted, one of a key it dropped is not.
func TestSessionCacheRotation(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		_, _, tok := b.readyNode(t)
		requireDoor(t, b.svc, tok, fleet.DoorAsk, nil) // remembered by b.svc
		newKey := bytes.Repeat([]byte{0x43}, 32)
		replica := func(ring *keys.Ring) (*fleet.Service, *metrics.Metrics) {
			m := metrics.New(nil)
			return fleet.New(fleet.Options{Store: b.store, Keys: ring, Settings: fleet.Settings{PublicURL: "https://cp.example"},
				Now: b.clock.Now, Metrics: m, Logger: slog.New(slog.DiscardHandler)}), m
		}
		kept, km := replica(keys.NewRing(newKey, testKey))
		for range 2 {
			requireDoor(t, kept, tok, fleet.DoorAsk, nil)
		}
		s, c := verifications(km)
		require.Equal(t, [2]float64{1, 1}, [2]float64{s, c}, "the old key kept for verification")
		gone, gm := replica(keys.NewRing(newKey))
		for range 2 {
			requireDoor(t, gone, tok, fleet.DoorAsk, fleet.ErrSessionInvalid)
		}
		s, c = verifications(gm)
		require.Equal(t, [2]float64{2, 0}, [2]float64{s, c}, "the old key dropped: refused, never remembered")
	})
}

// TestSessionCacheFencedRetired: a remembered token is still judged
// against the node's record: fenced by a re-enrollment, retired at the
// asking doors only.
func TestSessionCacheFencedRetired(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, _, tok := b.readyNode(t)
		boot, err := b.svc.Reinvite(ctx, "admin:test", node, nil)
		require.NoError(t, err)
		resp := b.enroll(t, boot)
		requireVerifications(t, b.metrics, 0, 2, "fenced on hits", func() {
			requireDoor(t, b.svc, tok, fleet.DoorAsk, fleet.ErrFenced)
			requireDoor(t, b.svc, tok, fleet.DoorReport, fleet.ErrFenced)
		})
		requireDoor(t, b.svc, resp.SessionToken, fleet.DoorAsk, nil)
		_, err = b.svc.Retire(ctx, "admin:test", node, "")
		require.NoError(t, err)
		requireVerifications(t, b.metrics, 0, 3, "retired on hits", func() {
			requireDoor(t, b.svc, resp.SessionToken, fleet.DoorAsk, fleet.ErrNodeRetired)
			requireDoor(t, b.svc, resp.SessionToken, fleet.DoorReport, nil)
			_, err := b.svc.Renew(ctx, resp.SessionToken)
			requireCode(t, err, fleet.ErrNodeRetired)
		})
	})
}

// TestSessionCacheConcurrent: many goroutines authenticate the same and
// different tokens, through a cache small enough to evict meanwhile; every
// answer is right and every check is counted once.
func TestSessionCacheConcurrent(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		type agent struct {
			node string
			toks []string
		}
		var agents []agent
		for range 6 {
			node, _, tok := b.readyNode(t)
			renewed, err := b.svc.Renew(ctx, tok)
			require.NoError(t, err)
			agents = append(agents, agent{node, []string{tok, renewed.SessionToken}})
		}
		s0, c0 := verifications(b.metrics)
		const workers, rounds = 12, 150
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 1))
				for range rounds {
					a := agents[r.IntN(len(agents))]
					sess, err := b.svc.Authenticate(ctx, a.toks[r.IntN(2)], fleet.Door(r.IntN(2)))
					if err == nil && sess.NodeID != a.node {
						err = errWrongNode
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		s1, c1 := verifications(b.metrics)
		require.Equal(t, float64(workers*rounds), (s1-s0)+(c1-c0), "each check counted once")
		require.Positive(t, s1-s0, "evicted tokens were verified again")
		require.Positive(t, c1-c0)
	}, func(st *fleet.Settings) { st.SessionCacheMaxTokens = 5 })
}

var errWrongNode = errorString("authenticated as another node")

type errorString string

func (e errorString) Error() string { return string(e) }

// BenchmarkAuthenticate times a session door's check of a valid token
// whose node is cached: remembered (hit) or verified by its signature
// (miss: the session cache disabled, as before it existed).
func BenchmarkAuthenticate(b *testing.B) {
	for _, c := range []struct {
		name string
		max  int
	}{{"hit", 0}, {"miss", -1}} {
		b.Run(c.name, func(b *testing.B) {
			db := dbtest.Open(b, "sqlite")
			fs := models.NewFleetStore(db, "bench", nil)
			svc := fleet.New(fleet.Options{Store: fs, Keys: keys.NewRing(testKey),
				Settings: fleet.Settings{PublicURL: "https://cp.example", ReplicaID: "bench", SessionCacheMaxTokens: c.max},
				Metrics:  metrics.New(nil), Logger: slog.New(slog.DiscardHandler)})
			fs.SetOnCommit(func(n []fleet.Notification) { svc.Deliver(n, "local") })
			boot, err := svc.Invite(ctx, "admin:bench", fleet.Invite{RentalID: benchID("r"), Generation: 1})
			if err != nil {
				b.Fatal(err)
			}
			resp, err := svc.Enroll(ctx, enrollReq(boot, time.Now()))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := svc.Authenticate(ctx, resp.SessionToken, fleet.DoorAsk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
