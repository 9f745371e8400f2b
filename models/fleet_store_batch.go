package models

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/dbtime"
)

func sortCommands(cs []fleet.Command) {
	sort.Slice(cs, func(i, j int) bool {
		if !cs[i].IssuedAt.Equal(cs[j].IssuedAt) {
			return cs[i].IssuedAt.Before(cs[j].IssuedAt)
		}
		return cs[i].OperationID < cs[j].OperationID
	})
}

// RenewLeases writes a batch of lease renewals and facts in one
// transaction: one commit for the whole batch, whatever its size.
func (s *FleetStore) RenewLeases(ctx context.Context, batch []fleet.LeaseRenewal) (int, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	// One order for every batch, so two writers of overlapping node sets
	// cannot deadlock on each other's row locks.
	batch = append([]fleet.LeaseRenewal(nil), batch...)
	sort.Slice(batch, func(i, j int) bool { return batch[i].NodeID < batch[j].NodeID })
	if n := len(s.group.lanes); n > 0 {
		// One part per lane, each in its lane's batch (routed by its first
		// node: every node of the part is of that lane), all at once: a
		// renewal batch never holds one lane's nodes while it waits for
		// another's. Renewals are independent of each other, so the parts
		// need not commit together.
		parts := make([][]fleet.LeaseRenewal, n)
		for _, r := range batch {
			i := laneOf(r.NodeID, n)
			parts[i] = append(parts[i], r)
		}
		var wg sync.WaitGroup
		changed := make([]int, n)
		errs := make([]error, n)
		for i, part := range parts {
			if len(part) == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				changed[i], errs[i] = s.renewLeases(fleet.OnNode(ctx, part[0].NodeID), part)
			}()
		}
		wg.Wait()
		total := 0
		for _, c := range changed {
			total += c
		}
		return total, errors.Join(errs...)
	}
	return s.renewLeases(ctx, batch)
}

// renewLeases writes renewals sorted by node id in one (group-committed)
// transaction.
func (s *FleetStore) renewLeases(ctx context.Context, batch []fleet.LeaseRenewal) (int, error) {
	changed := 0
	// The renewals ride the fleet's group commit: they share its commit,
	// and the fleet transactions of this replica never wait on them (nor
	// they on those) in a deadlock: in a lane, every request locks nodes
	// of that lane only, in node id order (group.go). A renewal refused by
	// a deadlock with another replica runs again (group.go).
	err := s.Tx(ctx, func(tx fleet.Tx) error {
		t := tx.(*fleetTx)
		g := t.db(ctx)
		changed = 0
		for i := 0; i < len(batch); i++ {
			r := batch[i]
			if err := t.stray(r.NodeID); err != nil {
				return err
			}
			if t.dialect == Postgres && r.Facts == nil {
				// A run of renewals without facts (held polls' and plain
				// heartbeats': nearly every batch whole) is one statement.
				j := i + 1
				for j < len(batch) && batch[j].Facts == nil {
					if err := t.stray(batch[j].NodeID); err != nil {
						return err
					}
					j++
				}
				n, err := renewRun(g, batch[i:j])
				if err != nil {
					return err
				}
				changed += n
				i = j - 1
				continue
			}
			until := dbtime.Norm(r.Until)
			if r.HeartbeatAt == nil && r.Facts == nil {
				// A held poll's renewal (most of every batch): the same
				// change as below in one fixed statement, without the
				// column map and the model's update machinery (~70 % of
				// what each renewal allocated).
				res := g.Exec(renewLeaseSQL, string(fleet.StateReady), string(fleet.StateLost), until, until,
					string(fleet.StateLost), string(fleet.StateReady), r.NodeID, string(fleet.StateEnrolling))
				if res.Error != nil {
					return res.Error
				}
				changed += int(res.RowsAffected)
				continue
			}
			// A lease only grows, and only for a live node: a retired node
			// still reports facts but is never given a lease again.
			// State: mirrors fleet.CanTransition for a heartbeat — lost
			// becomes ready, ready stays ready, and enrolling (excluded by
			// the WHERE clause) and retired nodes never change here.
			updates := map[string]any{
				"lease_expires_at": gorm.Expr("CASE WHEN state IN (?, ?) AND (lease_expires_at IS NULL OR lease_expires_at < ?) THEN ? ELSE lease_expires_at END",
					string(fleet.StateReady), string(fleet.StateLost), until, until),
				"state": gorm.Expr("CASE WHEN state = ? THEN ? ELSE state END", string(fleet.StateLost), string(fleet.StateReady)),
			}
			if r.HeartbeatAt != nil {
				updates["last_heartbeat_at"] = dbtime.Norm(*r.HeartbeatAt)
			}
			if r.Facts != nil {
				f := string(r.Facts.JSON)
				updates["facts"] = f
				updates["facts_observed_at"] = dbtime.Norm(r.Facts.ObservedAt)
				updates["facts_received_at"] = dbtime.Norm(r.Facts.ReceivedAt)
				updates["agent_version"] = r.Facts.AgentVersion
				updates["disk_state"] = r.Facts.Disk.State
				updates["disk_free_bytes"] = r.Facts.Disk.FreeBytes
				updates["disk_observed_at"] = dbtime.NormPtr(r.Facts.Disk.ObservedAt)
			}
			res := g.Model(&Node{}).Where("id = ? AND state <> ?", r.NodeID, string(fleet.StateEnrolling)).Updates(updates)
			if res.Error != nil {
				return res.Error
			}
			changed += int(res.RowsAffected)
			if r.Facts != nil && r.Facts.Announce && res.RowsAffected > 0 {
				// The capabilities may have changed: every replica's node
				// cache forgets the node (sent with the batch's commit).
				if err := t.Notify(ctx, fleet.Notification{Kind: fleet.NotifyNode, NodeID: r.NodeID}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return changed, err
}

// renewRun writes a run of renewals without facts, sorted by node id, in
// one statement (Postgres): a round trip for the run instead of one per
// node. It locks the rows in node id order first (the materialized CTE:
// LockRows runs above its Sort), so the run keeps the batch's lock order;
// the change is renewLeaseSQL's, with the heartbeat's time where there is
// one. A node named twice keeps the later lease and heartbeat.
func renewRun(g *gorm.DB, run []fleet.LeaseRenewal) (int, error) {
	ids := make([]string, 0, len(run))
	until := make([]time.Time, 0, len(run))
	beats := make([]*time.Time, 0, len(run))
	for _, r := range run {
		u := dbtime.Norm(r.Until)
		var hb *time.Time
		if r.HeartbeatAt != nil {
			t := dbtime.Norm(*r.HeartbeatAt)
			hb = &t
		}
		if k := len(ids) - 1; k >= 0 && ids[k] == r.NodeID {
			if u.After(until[k]) {
				until[k] = u
			}
			if hb != nil && (beats[k] == nil || hb.After(*beats[k])) {
				beats[k] = hb
			}
			continue
		}
		ids, until, beats = append(ids, r.NodeID), append(until, u), append(beats, hb)
	}
	n, err := execRows(g, renewRunSQL, ids, until, beats, string(fleet.StateReady), string(fleet.StateLost),
		string(fleet.StateLost), string(fleet.StateReady), string(fleet.StateEnrolling))
	return int(n), err
}

// renewRunSQL is renewRun's statement: arrays of node ids, leases and
// heartbeat times (NULL: none). Its rows are locked in id order FOR NO
// KEY UPDATE, the lock its UPDATE takes anyway: it does not wait for a
// command's submit (FOR KEY SHARE, IssueToNode) nor for the foreign-key
// checks of rows that name the node, which FOR UPDATE did.
//
// Its plan must stay linear whatever the planner believes, since a
// restarted replica's first renewals (every reconnecting agent's, hundreds
// to thousands a lane) run on every lane at once and every write queues
// behind them. Two beliefs made it quadratic — a nested loop rescanning
// the arrays for every node, 1–3 s of CPU a lane (BENCHMARKS.md,
// nineteenth sitting):
//   - the generic plan a pooled connection switches to costs an unnest
//     of parameters at 10 rows: so the arrays are read once, into locked,
//     which carries the values the UPDATE writes;
//   - statistics taken while the nodes were enrolling (a fleet invited
//     and enrolled within the minute before the restart) cost any
//     "state <> 'enrolling'" filter on nodes at one row: so no join
//     filters nodes by state; the UPDATE skips enrolling nodes by the
//     state locked carries.
var renewRunSQL = numbered(`WITH v AS (SELECT * FROM unnest(?::text[], ?::timestamptz[], ?::timestamptz[]) AS v(id, until, heartbeat_at)),
	locked AS MATERIALIZED (SELECT n.id, n.state, v.until, v.heartbeat_at FROM nodes n JOIN v ON v.id = n.id ORDER BY n.id FOR NO KEY UPDATE OF n)
	UPDATE nodes SET
	lease_expires_at = CASE WHEN nodes.state IN (?, ?) AND (nodes.lease_expires_at IS NULL OR nodes.lease_expires_at < l.until) THEN l.until ELSE nodes.lease_expires_at END,
	state = CASE WHEN nodes.state = ? THEN ? ELSE nodes.state END,
	last_heartbeat_at = COALESCE(l.heartbeat_at, nodes.last_heartbeat_at)
	FROM locked l WHERE nodes.id = l.id AND l.state <> ?`)

// renewLeaseSQL is RenewLeases' change for a renewal without heartbeat or
// facts: a lease only grows, and only for a live node; a lost node becomes
// ready; enrolling nodes are left alone. (SET reads the row as it was, so
// both CASEs see the old state.)
const renewLeaseSQL = `UPDATE nodes SET
	lease_expires_at = CASE WHEN state IN (?, ?) AND (lease_expires_at IS NULL OR lease_expires_at < ?) THEN ? ELSE lease_expires_at END,
	state = CASE WHEN state = ? THEN ? ELSE state END
	WHERE id = ? AND state <> ?`

// sweepLock is the advisory lock that makes the lease sweep a singleton
// across replicas: one per schema, as maintainLock, so deployments (and
// test schemas) sharing a database never skip each other's sweeps.
const sweepLock = `hashtextextended('nodeward.sweep.' || current_schema(), 0)`

// SweepLeases marks lapsed ready nodes lost.
func (s *FleetStore) SweepLeases(ctx context.Context, now time.Time) ([]string, bool, error) {
	// The sweep's transaction runs in the exclusive lane, holding every
	// write lane of this replica back while it waits for them to finish;
	// every replica sweeps every few seconds, and nearly always nothing
	// has lapsed (a goroutine dump of a 50,000-agent bring-up caught such
	// a sweep waiting for the gate, two lanes of enrollments queued behind
	// it). A plain read asks first; the transaction checks again under
	// its lock. No index holds the lease, so that a renewal stays a
	// heap-only update (migration 00023): the read goes over the ready
	// nodes, about 6 ms at 50,000 on Postgres, once a sweep interval.
	var due bool
	if err := s.db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM nodes WHERE state = ? AND lease_expires_at < ?)`,
		string(fleet.StateReady), dbtime.Norm(now)).Scan(&due).Error; err != nil {
		return nil, true, err
	}
	if !due {
		return nil, true, nil
	}
	var lost []string
	swept := true
	err := s.Tx(ctx, func(tx fleet.Tx) error {
		g := tx.(*fleetTx).g.WithContext(ctx)
		if s.dialect == Postgres {
			var got bool
			if err := g.Raw("SELECT pg_try_advisory_xact_lock(" + sweepLock + ")").Scan(&got).Error; err != nil {
				return err
			}
			if !got {
				swept = false
				return nil
			}
		}
		// Mirrors fleet.CanTransition: only a ready node becomes lost.
		var rows []Node
		if err := g.Raw(`UPDATE nodes SET state = ?, updated_at = ?
			WHERE state = ? AND lease_expires_at < ? RETURNING id`,
			string(fleet.StateLost), dbtime.Norm(now), string(fleet.StateReady), dbtime.Norm(now)).Scan(&rows).Error; err != nil {
			return err
		}
		for _, r := range rows {
			lost = append(lost, r.ID)
			if err := tx.AppendAudit(ctx, fleet.AuditEntry{At: now, Actor: "system", Action: "node.lost", NodeID: r.ID,
				Detail: map[string]any{"reason": "lease lapsed without a heartbeat"}}); err != nil {
				return err
			}
			if err := tx.Notify(ctx, fleet.Notification{Kind: fleet.NotifyNode, NodeID: r.ID}); err != nil {
				return err
			}
		}
		return nil
	})
	sort.Strings(lost)
	return lost, swept, err
}

// CountPendingCommands counts unsettled commands.
func (s *FleetStore) CountPendingCommands(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.WithContext(ctx).Model(&Command{}).Where("state = ?", string(fleet.CommandPending)).Count(&n).Error
	return n, err
}

// FoldNodeCounts folds the nodes-by-state counter's log of changes into
// one row per state. On Postgres one statement deletes the rows it sees
// and writes back their sums: a change committed meanwhile is left for
// the next fold, and two folds at once never count a row twice (the
// second skips rows the first deleted). SQLite has one writer.
func (s *FleetStore) FoldNodeCounts(ctx context.Context) error {
	if s.dialect == Postgres {
		return s.db.WithContext(ctx).Exec(`WITH gone AS (
				DELETE FROM node_state_counts WHERE (SELECT COUNT(*) FROM node_state_counts) > ? RETURNING state, n)
			INSERT INTO node_state_counts(state, n) SELECT state, SUM(n) FROM gone GROUP BY state`, foldAbove).Error
	}
	// Through the one writer (DB.Tx): a transaction of its own on the
	// readers' pool would meet the group commit's in SQLite's busy handler.
	return s.db.Tx(ctx, func(g *gorm.DB) error {
		var n int64
		if err := g.Raw(`SELECT COUNT(*) FROM node_state_counts`).Scan(&n).Error; err != nil || n <= foldAbove {
			return err
		}
		var rows []struct {
			State string
			N     int64
		}
		if err := g.Raw(countNodesSQL).Scan(&rows).Error; err != nil {
			return err
		}
		if err := g.Exec(`DELETE FROM node_state_counts`).Error; err != nil {
			return err
		}
		for _, r := range rows {
			if err := g.Exec(`INSERT INTO node_state_counts(state, n) VALUES (?, ?)`, r.State, r.N).Error; err != nil {
				return err
			}
		}
		return nil
	})
}

// foldAbove is how many counter rows are left unfolded: one per state and
// a few changes, so an idle fleet rewrites nothing.
const foldAbove = 16

// Summarize answers the overview's counts. Each is one index range or a
// counter: nodes by state from the trigger-kept counter, lapsing leases its ready range up to the
// lapse time, pending and refused commands their partial indexes (states
// written as literals so SQLite matches the partial indexes' WHERE).
func (s *FleetStore) Summarize(ctx context.Context, w fleet.SummaryWindow) (fleet.Summary, error) {
	sum := fleet.Summary{}
	var err error
	if sum.ByState, err = s.CountNodesByState(ctx); err != nil {
		return sum, err
	}
	var row struct {
		Lapsing, Pending, Refused int64
	}
	err = s.db.WithContext(ctx).Raw(summarizeSQL, dbtime.Norm(w.LapseBefore), dbtime.Norm(w.RefusedSince)).Scan(&row).Error
	sum.Lapsing, sum.PendingCommands, sum.RefusedCommands = row.Lapsing, row.Pending, row.Refused
	return sum, err
}

const summarizeSQL = `SELECT
 (SELECT COUNT(*) FROM nodes WHERE state = 'ready' AND lease_expires_at < ?) AS lapsing,
 (SELECT COUNT(*) FROM commands WHERE state = 'pending') AS pending,
 (SELECT COUNT(*) FROM commands WHERE state = 'refused' AND settled_at >= ?) AS refused`

// PublishSessions upserts this replica's row with its held long-polls.
func (s *FleetStore) PublishSessions(ctx context.Context, replica string, started, now time.Time, sessions []fleet.LiveSession) error {
	if sessions == nil {
		sessions = []fleet.LiveSession{}
	}
	b, err := json.Marshal(sessions)
	if err != nil {
		return err
	}
	row := Replica{ID: replica, StartedAt: dbtime.Norm(started), HeartbeatAt: dbtime.Norm(now), Sessions: string(b)}
	return s.db.Write(ctx, func(g *gorm.DB) error { return g.Save(&row).Error })
}

// TouchReplica refreshes this replica's heartbeat only.
func (s *FleetStore) TouchReplica(ctx context.Context, replica string, now time.Time) (bool, error) {
	var touched bool
	err := s.db.Write(ctx, func(g *gorm.DB) error {
		res := g.Model(&Replica{}).Where("id = ?", replica).Update("heartbeat_at", dbtime.Norm(now))
		touched = res.RowsAffected == 1
		return res.Error
	})
	return touched, err
}

// Replicas implements fleet.Store; it leaves the session lists out.
func (s *FleetStore) Replicas(ctx context.Context) ([]fleet.ReplicaBeat, error) {
	var rows []Replica
	if err := s.db.WithContext(ctx).Select("id", "started_at", "heartbeat_at").Order("id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := make([]fleet.ReplicaBeat, len(rows))
	for i, r := range rows {
		out[i] = fleet.ReplicaBeat{ID: r.ID, StartedAt: r.StartedAt, HeartbeatAt: r.HeartbeatAt}
	}
	return out, nil
}

// ListSessions merges the sessions of every replica fresh since freshAfter.
func (s *FleetStore) ListSessions(ctx context.Context, freshAfter time.Time) ([]fleet.LiveSession, error) {
	var rows []Replica
	if err := s.db.WithContext(ctx).Where("heartbeat_at >= ?", dbtime.Norm(freshAfter)).Order("id").Find(&rows).Error; err != nil {
		return nil, err
	}
	out := []fleet.LiveSession{}
	for _, r := range rows {
		var ss []fleet.LiveSession
		if err := json.Unmarshal([]byte(r.Sessions), &ss); err != nil {
			continue
		}
		out = append(out, ss...)
	}
	return out, nil
}
