package models

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/nodeward/nodeward/fleet"
)

// announcer sends the other replicas (Postgres) the notifications that may
// follow their commit (fleet.Notification.MayFollowCommit: work due for a
// node, an operation that started or ended, work to dispatch) once the
// transactions that made them have committed, in a statement of its own:
// at once when none is on its way, else with whatever else committed
// meanwhile in the next (one statement in flight at a time, so the
// batches grow with the load and add no wait when it is light).
//
// Why not inside the writing transaction, as fencing and revocations are:
// Postgres serialises every committing transaction that notified on one
// lock (the notification queue's), held through that transaction's WAL
// flush, so every submit, claim and settlement commit of every replica
// queued behind the others' flushes (measured: most of the lock waits of
// three replicas at saturation). A transaction that only notifies writes
// no WAL of its own and flushes nothing, so it holds the lock for a
// moment.
//
// What it costs: a round trip more before another replica hears; and a
// process that dies between a commit and the send never announces that
// commit. Nothing is lost, since every reader reads the committed
// state: the other replicas resync once they see the dead one's heartbeat
// lapse (fleet's peer watch), and ledger waiters re-check on their own
// (ledger.Settings.Recheck).
//
// A replica that knows no other (fleet's peer watch: no fresh heartbeat,
// no listener greeting) sends nothing: each statement was a round trip
// and a transaction with an xid and a commit record, and the replica's
// own listener the only one to hear it, to drop it (BENCHMARKS.md,
// thirty-third sitting).
type announcer struct {
	db      *gorm.DB
	channel string
	// resync is this replica's NotifyResync payload: what replaces a
	// batch that could not be sent, and what a replica that was alone
	// sends first when another appears.
	resync string

	// alone: no other replica is known to listen; add drops what it is
	// given. False until the peer watch has looked.
	alone atomic.Bool

	mu      sync.Mutex
	queued  []string
	sending bool // a sender goroutine runs; it takes what is queued

	stats announceCounters
}

type announceCounters struct {
	statements, payloads, failures, unsent atomic.Int64
}

// AnnounceStats are the announcer's counters since the store was made.
type AnnounceStats struct {
	// Statements is how many notify statements were sent, Payloads how
	// many notifications they carried, Failures how many statements
	// failed (a failed batch is replaced by a resync: send), Unsent how
	// many notifications were dropped because no other replica listened.
	Statements, Payloads, Failures, Unsent int64
}

func newAnnouncer(db *gorm.DB, channel, replica string) *announcer {
	return &announcer{db: db, channel: channel, resync: fleet.Notification{Kind: fleet.NotifyResync}.Encode(replica)}
}

// add queues payloads to be sent, at once or right after the statement on
// its way. Call it only once what they announce has committed. A nil
// announcer (SQLite: one process) drops them.
func (a *announcer) add(payloads ...string) {
	if a == nil || len(payloads) == 0 {
		return
	}
	if a.alone.Load() {
		a.stats.unsent.Add(int64(len(payloads)))
		return
	}
	a.enqueue(payloads)
}

func (a *announcer) enqueue(payloads []string) {
	a.mu.Lock()
	a.queued = append(a.queued, payloads...)
	start := !a.sending
	a.sending = true
	a.mu.Unlock()
	if start {
		go a.send()
	}
}

// send sends what is queued, all of it per statement, until nothing is:
// one sender at a time, so a slow database gathers payloads into fewer
// statements rather than piling up senders. A batch that fails may never
// arrive, and its sender is alive, so no peer watch covers it: the other
// replicas are told to resync instead (drop what they know, read again),
// retried with backoff until the database takes it.
func (a *announcer) send() {
	var backoff time.Duration
	for {
		a.mu.Lock()
		batch := a.queued
		a.queued = nil
		if len(batch) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if a.sendBatch(batch) == nil {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, 50*time.Millisecond), 5*time.Second)
		time.Sleep(backoff)
		a.mu.Lock()
		// The resync covers the failed batch, and whatever it is sent with.
		a.queued = append(a.queued, a.resync)
		a.mu.Unlock()
	}
}

// sendBatch sends payloads in one statement. One parameter however many
// payloads; Postgres folds identical payloads of one transaction into one
// notification.
func (a *announcer) sendBatch(batch []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := execRows(a.db.WithContext(ctx), announceSQL, a.channel, batch)
	a.stats.statements.Add(1)
	a.stats.payloads.Add(int64(len(batch)))
	if err != nil {
		a.stats.failures.Add(1)
	}
	return err
}

// OthersListening implements fleet.Store.
//
// Why a resync covers what was dropped: add reads alone after its commit,
// so a payload dropped belongs to a commit that ended before alone turned
// false here, and the resync is queued after that. Every replica that hears
// the resync reads the committed state after it, that commit's included.
// One whose listener connects later reads everything when it connects.
func (s *FleetStore) OthersListening(present bool) {
	a := s.announcer
	if a == nil {
		return
	}
	if was := a.alone.Swap(!present); was && present {
		a.enqueue([]string{a.resync})
	}
}

// Flush sends at once what the announcer holds (a replica shutting down
// announces what it committed before it closes the database).
func (s *FleetStore) Flush() {
	a := s.announcer
	if a == nil {
		return
	}
	a.mu.Lock()
	batch := a.queued
	a.queued = nil
	a.mu.Unlock()
	if len(batch) > 0 {
		_ = a.sendBatch(batch) // shutting down: the others' peer watch covers a failure
	}
}

// announceSQL sends its second parameter's payloads on its first's
// channel. Sent around GORM (sqlpath.go), which would expand the list.
var announceSQL = numbered(`SELECT pg_notify(?, p) FROM unnest(?::text[]) AS p`)

// AnnounceStats answers the announcer's counters (zero on SQLite).
func (s *FleetStore) AnnounceStats() AnnounceStats {
	if s.announcer == nil {
		return AnnounceStats{}
	}
	c := &s.announcer.stats
	return AnnounceStats{Statements: c.statements.Load(), Payloads: c.payloads.Load(), Failures: c.failures.Load(),
		Unsent: c.unsent.Load()}
}
