package models

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"
)

// SQLite checkpoints off the writer. By default the commit that takes the
// write-ahead log past 1,000 pages copies them into the database file
// and syncs it before it returns: the group commit's one writer stopped
// for that copy every few hundred batches, and every request queued
// behind it waited too (about 3 % of the process's CPU at 1,000 commands
// a second, all of it on the writer, in bursts). A goroutine of the DB
// now runs a PASSIVE checkpoint on a reader connection every
// CheckpointEvery: it copies what no reader still needs and never waits
// on the writer or the readers, so when the writer's own checkpoint comes
// due it finds the pages copied and has little left to do. That one is
// kept (wal_autocheckpoint stays 1,000) because it is what starts the log
// over: the writer restarts the log only when a transaction of its own
// begins on a log copied to the end, which a checkpoint run elsewhere
// between two of its transactions, under steady writes, rarely leaves —
// without it the log grew with every write (TestSQLiteCheckpointsOffTheWriter).
// Durability is the log's (synchronous FULL): checkpoints only move
// committed pages.

// DefaultCheckpointEvery is how often the SQLite checkpointer runs.
const DefaultCheckpointEvery = 500 * time.Millisecond

type checkpointer struct {
	stop   context.CancelFunc
	done   chan struct{}
	once   sync.Once
	runs   atomic.Int64 // checkpoints run
	frames atomic.Int64 // log frames copied into the database file
}

// CheckpointStats are the SQLite checkpointer's counters.
type CheckpointStats struct {
	// Runs is how many checkpoints ran; Frames how many log frames (pages)
	// they copied into the database file.
	Runs, Frames int64
}

// CheckpointStats answers the SQLite checkpointer's counters (zero on
// Postgres).
func (db *DB) CheckpointStats() CheckpointStats {
	if db.ckpt == nil {
		return CheckpointStats{}
	}
	return CheckpointStats{Runs: db.ckpt.runs.Load(), Frames: db.ckpt.frames.Load()}
}

func startCheckpointer(pool *sql.DB, every time.Duration) *checkpointer {
	if every <= 0 {
		every = DefaultCheckpointEvery
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &checkpointer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c.run(ctx, pool)
		}
	}()
	return c
}

// run runs one PASSIVE checkpoint. An error (the database closing, a
// reader's lock) leaves the pages for the next run.
func (c *checkpointer) run(ctx context.Context, pool *sql.DB) {
	var busy, logFrames, copied int64
	if err := pool.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &copied); err != nil {
		return
	}
	c.runs.Add(1)
	if copied > 0 {
		c.frames.Add(copied)
	}
}

// close stops the checkpointer and waits for its run in flight.
func (c *checkpointer) close() {
	c.once.Do(func() {
		c.stop()
		<-c.done
	})
}
