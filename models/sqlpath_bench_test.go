package models_test

import (
	"encoding/json"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// BenchmarkCommandPath measures the command path's hot statements one
// transaction per op, as the server runs them: "issue" records a command
// kind's operation with its command (ledger InsertOperation kept back,
// then IssueToNode: one statement on Postgres), "hand" the same command
// handed to a held poll (inserted delivered, its operation running);
// "claim" is a poll's
// ClaimDue of one command (a redelivery each op, so every op claims
// exactly one row and the table does not grow); "count" is the submit's
// per-node quota count and "lock" a settlement's LockCommands of one
// command, each alone in its transaction. Run with -benchmem and a
// fixed -benchtime (e.g. 500x). The wall time is mostly Postgres's (the
// round trip, the commit); cpu-ns/op is this process's own CPU (user and
// system) per op, what the server spends per command.
func BenchmarkCommandPath(b *testing.B) {
	for _, d := range dbtest.Dialects(b) {
		b.Run(d, func(b *testing.B) {
			db := dbtest.Open(b, d)
			fs := models.NewFleetStore(db, "r1", nil)
			ls := models.NewLedgerStore(fs)
			n := sampleNode("n1", "rent-bench", 1)
			n.State, n.FencingToken = fleet.StateReady, 1
			insert(b, fs, n)
			payload := json.RawMessage(`{"image":"registry.example.com/team/app:v1"}`)
			// The claim's node and its one command (the sub-benchmarks run
			// more than once: their state lives here).
			m := sampleNode("n2", "rent-bench-2", 1)
			m.State, m.FencingToken = fleet.StateReady, 1
			insert(b, fs, m)
			require.NoError(b, fs.Tx(ctx, func(tx fleet.Tx) error {
				return tx.InsertCommand(ctx, fleet.Command{OperationID: "claimed", NodeID: "n2", Kind: "prepare_image",
					Payload: payload, PayloadDigest: "d", FencingToken: 1, IssuedAt: t0, State: fleet.CommandPending})
			}))
			seq, claims := 0, 0

			issue := func(handed bool) func(b *testing.B) {
				return func(b *testing.B) {
					b.ReportAllocs()
					defer reportCPU(b)()
					for i := 0; i < b.N; i++ {
						seq++
						id := "op-" + strconv.Itoa(seq)
						op := &ledger.Operation{ID: id, RequestID: "req-" + id, Digest: "d", PrincipalKind: ledger.PrincipalAdmin,
							PrincipalID: "u1", Family: ledger.FamilyCommands, Kind: ledger.KindNodePrepareImage, State: ledger.StatePending,
							Channel: ledger.ChannelLongPoll, Targets: []ledger.Target{{Kind: ledger.TargetNode, ID: "n1"}},
							TargetKind: ledger.TargetNode, TargetID: "n1", Operation: payload, CreatedAt: t0, Deadline: t0.Add(time.Hour), UpdatedAt: t0}
						c := fleet.Command{OperationID: id, NodeID: "n1", Kind: "prepare_image",
							Payload: payload, PayloadDigest: "d", IssuedAt: t0, State: fleet.CommandPending}
						if handed {
							fencing, at := int64(1), t0.Add(time.Second)
							c.DeliveredFencing, c.FirstDeliveredAt, c.LastDeliveredAt, c.DeliveryCount = &fencing, &at, &at, 1
						}
						err := ls.Tx(ctx, func(tx ledger.Tx) error {
							if err := tx.InsertOperation(ctx, op, ledger.Event{OperationID: id, Type: ledger.EventSubmitted, At: t0,
								Data: json.RawMessage(`{}`)}); err != nil {
								return err
							}
							_, ok, err := tx.Fleet().IssueToNode(ctx, c)
							if err == nil && !ok {
								b.Fatal("not issued")
							}
							return err
						})
						if err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.Run("issue", issue(false))
			b.Run("hand", issue(true))

			b.Run("count", func(b *testing.B) {
				b.ReportAllocs()
				defer reportCPU(b)()
				for i := 0; i < b.N; i++ {
					err := ls.Tx(ctx, func(tx ledger.Tx) error {
						_, err := tx.CountOpenForNode(ctx, "n2", []string{ledger.KindNodeRetire})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})

			b.Run("lock", func(b *testing.B) {
				b.ReportAllocs()
				defer reportCPU(b)()
				for i := 0; i < b.N; i++ {
					var got map[string]fleet.Command
					err := fs.Tx(ctx, func(tx fleet.Tx) error {
						var err error
						got, err = tx.LockCommands(ctx, []string{"claimed"})
						return err
					})
					if err != nil || len(got) != 1 {
						b.Fatalf("lock: %d commands, %v", len(got), err)
					}
				}
			})

			b.Run("claim", func(b *testing.B) {
				b.ReportAllocs()
				defer reportCPU(b)()
				for i := 0; i < b.N; i++ {
					claims++
					now := t0.Add(time.Duration(claims) * 2 * time.Minute)
					var got []fleet.Command
					err := fs.Tx(ctx, func(tx fleet.Tx) error {
						var err error
						_, got, err = tx.ClaimDue(ctx, fleet.Due{NodeID: "n2", Fencing: 1, Now: now, RedeliverBefore: now.Add(-time.Minute), Limit: 10})
						return err
					})
					if err != nil || len(got) != 1 {
						b.Fatalf("claim: %d commands, %v", len(got), err)
					}
				}
			})
		})
	}
}

// reportCPU reports the process's CPU time per op from here to the call
// of the function it answers.
func reportCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() { b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op") }
}
