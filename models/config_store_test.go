package models_test

import (
	"encoding/json"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/models"
)

// The desired configuration's store promises (DECISIONS.md §32), on every
// dialect, through the fleet's own rules.

func configService(s *models.FleetStore) *fleet.Service {
	return fleet.New(fleet.Options{Store: s, Now: func() time.Time { return t0 }, Logger: slog.New(slog.DiscardHandler)})
}

func configure(t *testing.T, s *models.FleetStore, f *fleet.Service, node, doc string, force bool) fleet.ConfigureOutcome {
	t.Helper()
	var out fleet.ConfigureOutcome
	require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
		var err error
		out, err = f.ConfigureTx(ctx, tx, fleet.Configure{NodeID: node, OperationID: "op-" + doc, Format: "test/v1",
			Document: json.RawMessage(doc), Force: force})
		return err
	}))
	return out
}

func report(t *testing.T, f *fleet.Service, sess fleet.Session, id string, rev int64, hash, state string, at time.Time) {
	t.Helper()
	_, err := f.RecordEvents(ctx, sess, []api.Event{{ID: id, Kind: api.EventConfig, ObservedAt: at,
		Config: &api.ConfigReport{Revision: rev, Hash: hash, State: state, Message: "m-" + id}}})
	require.NoError(t, err)
}

func TestConfigStoreRevisions(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("n1", "r1", 1), sampleNode("n2", "r2", 1))
		f := configService(s)

		_, err := s.NodeConfig(ctx, "n1")
		require.ErrorIs(t, err, fleet.ErrNoRows)

		first := configure(t, s, f, "n1", `{"b":1,"a":[1,2]}`, false)
		require.Equal(t, int64(1), first.Revision, "revisions start at 1")
		require.True(t, first.Changed)
		want, err := fleet.ConfigHash("test/v1", json.RawMessage(`{"a":[1,2],"b":1}`))
		require.NoError(t, err)
		require.Equal(t, want, first.Hash, "the hash is of the canonical JSON")

		// The same document, formatted otherwise: nothing written.
		stored, err := s.NodeConfig(ctx, "n1")
		require.NoError(t, err)
		notes := len(rec.all())
		same := configure(t, s, f, "n1", `{ "a": [1, 2], "b": 1.0 }`, false)
		require.Equal(t, fleet.ConfigureOutcome{Revision: 1, Hash: want}, same)
		again, err := s.NodeConfig(ctx, "n1")
		require.NoError(t, err)
		require.Equal(t, stored, again, "an unchanged document writes nothing")
		require.Len(t, rec.all(), notes, "and wakes nobody")

		second := configure(t, s, f, "n1", `{"a":2}`, false)
		require.Equal(t, int64(2), second.Revision, "a changed hash grows the revision by one")
		cleared := configure(t, s, f, "n1", `null`, false)
		require.Equal(t, int64(3), cleared.Revision, "null clears: a new revision with no document")
		got, err := s.NodeConfig(ctx, "n1")
		require.NoError(t, err)
		require.Nil(t, got.Box)
		require.Equal(t, int64(0), got.AppliedRevision, "nothing applied yet")
		require.False(t, got.Lagging, "never reported: not lagging")
		require.Equal(t, fleet.VerdictNone, got.Verdict())
	})
}

// TestConfigStoreConcurrentConfigures: concurrent configures of one node
// serialize on its row: revisions 1..N, none skipped or reused.
func TestConfigStoreConcurrentConfigures(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		insert(t, s, sampleNode("n1", "r1", 1))
		f := configService(s)
		const n = 12
		revs := make([]int64, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The node's row is locked first: the configures queue on it
				// rather than race (nothing to retry).
				err := s.Tx(ctx, func(tx fleet.Tx) error {
					out, err := f.ConfigureTx(ctx, tx, fleet.Configure{NodeID: "n1", OperationID: "op-" + strconv.Itoa(i),
						Format: "test/v1", Document: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)})
					revs[i] = out.Revision
					return err
				})
				if err != nil {
					t.Errorf("configure %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		sort.Slice(revs, func(a, b int) bool { return revs[a] < revs[b] })
		for i, r := range revs {
			require.Equal(t, int64(i+1), r, "revisions %v", revs)
		}
		got, err := s.NodeConfig(ctx, "n1")
		require.NoError(t, err)
		require.Equal(t, int64(n), got.Revision)
	})
}

// TestConfigStoreLagging: lagging needs a report and an applied revision
// behind the desired one; retired nodes never lag; never_reported counts
// configured nodes without a report.
func TestConfigStoreLagging(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, _ *recorder) {
		var nodes []fleet.Node
		for i := range 4 {
			n := sampleNode("n"+strconv.Itoa(i), "r"+strconv.Itoa(i), 1)
			n.State = fleet.StateReady
			nodes = append(nodes, n)
		}
		insert(t, s, nodes...)
		f := configService(s)
		sess := func(id string) fleet.Session { return fleet.Session{NodeID: id, Fencing: 1} }
		hashes := map[string]string{}
		for _, n := range nodes {
			hashes[n.ID] = configure(t, s, f, n.ID, `{"v":1}`, false).Hash
		}
		lagging, never, err := s.CountConfigs(ctx)
		require.NoError(t, err)
		require.Equal(t, [2]int64{0, 4}, [2]int64{lagging, never})

		// n0 applies revision 1, then gets revision 2: lagging.
		report(t, f, sess("n0"), "e0", 1, hashes["n0"], api.ConfigApplied, t0)
		configure(t, s, f, "n0", `{"v":2}`, false)
		// n1 reports failed: lagging (applied 0 < 1).
		report(t, f, sess("n1"), "e1", 1, hashes["n1"], api.ConfigFailed, t0)
		// n2 applies: not lagging.
		report(t, f, sess("n2"), "e2", 1, hashes["n2"], api.ConfigApplied, t0)
		lagging, never, err = s.CountConfigs(ctx)
		require.NoError(t, err)
		require.Equal(t, [2]int64{2, 1}, [2]int64{lagging, never})
		page, err := s.LaggingConfigs(ctx, "", 1)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, "n1", page[0].NodeID, "by node id, descending")
		page, err = s.LaggingConfigs(ctx, "n1", 10)
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, "n0", page[0].NodeID)
		require.Equal(t, fleet.VerdictStale, page[0].Verdict())

		// Retired nodes never lag.
		_, err = f.Retire(ctx, "test", "n1", "")
		require.NoError(t, err)
		_, err = f.Retire(ctx, "test", "n3", "")
		require.NoError(t, err)
		lagging, never, err = s.CountConfigs(ctx)
		require.NoError(t, err)
		require.Equal(t, [2]int64{1, 0}, [2]int64{lagging, never})
	})
}

// TestConfigVerdicts is the verdict table.
func TestConfigVerdicts(t *testing.T) {
	desired := fleet.NodeConfig{Revision: 3, Hash: "h3"}
	rep := func(rev int64, hash, state string) *fleet.ConfigReport {
		return &fleet.ConfigReport{Revision: rev, Hash: hash, State: state}
	}
	for _, tc := range []struct {
		name string
		cfg  fleet.NodeConfig
		rep  *fleet.ConfigReport
		want string
	}{
		{"applied", desired, rep(3, "h3", api.ConfigApplied), fleet.VerdictApplied},
		{"failed", desired, rep(3, "h3", api.ConfigFailed), fleet.VerdictFailed},
		{"stale", desired, rep(2, "h2", api.ConfigApplied), fleet.VerdictStale},
		{"mismatch: the desired revision, another hash", desired, rep(3, "other", api.ConfigApplied), fleet.VerdictMismatch},
		{"mismatch: a revision never stored", desired, rep(4, "h4", api.ConfigApplied), fleet.VerdictMismatch},
		{"mismatch: no desired configuration", fleet.NodeConfig{}, rep(1, "h1", api.ConfigApplied), fleet.VerdictMismatch},
		{"none: never reported", desired, nil, fleet.VerdictNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.Reported = tc.rep
			require.Equal(t, tc.want, c.Verdict())
		})
	}
}

// TestConfigStoreHead: the row without its document reads as the whole
// row does, every field but the document's.
func TestConfigStoreHead(t *testing.T) {
	withStore(t, func(t *testing.T, s *models.FleetStore, rec *recorder) {
		insert(t, s, sampleNode("n1", "r1", 1))
		f := configService(s)
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			_, err := tx.LockNodeConfigHead(ctx, "n1")
			require.ErrorIs(t, err, fleet.ErrNoRows)
			return nil
		}))
		configure(t, s, f, "n1", `{"a":1}`, false)
		configure(t, s, f, "n1", `{"a":2}`, false)
		require.NoError(t, s.Tx(ctx, func(tx fleet.Tx) error {
			whole, err := tx.LockNodeConfig(ctx, "n1")
			require.NoError(t, err)
			require.NotNil(t, whole.Box)
			head, err := tx.LockNodeConfigHead(ctx, "n1")
			require.NoError(t, err)
			require.Nil(t, head.Box, "no document")
			head.Box = whole.Box
			require.Equal(t, whole, head, "every other field as stored")
			return nil
		}))
	})
}
