package models_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/nodeward/nodeward/models"
)

// A data folder whose name has URI characters still holds the database.
func TestSQLiteDataDirWithURICharacters(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data #1 ?x=y %20")
	db, err := models.Open(ctx, models.Options{DataDir: dir})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Migrate(ctx))
	st, err := os.Stat(filepath.Join(dir, "nodeward.db"))
	require.NoError(t, err)
	require.Greater(t, st.Size(), int64(0))
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the database is private to its user")
	var mode string
	require.NoError(t, db.Raw("PRAGMA journal_mode").Scan(&mode).Error)
	require.Equal(t, "wal", mode)
	var sync int
	require.NoError(t, db.Raw("PRAGMA synchronous").Scan(&sync).Error)
	require.Equal(t, 2, sync, "synchronous=FULL")
}

// SQLite is one process: a second opener of the data folder is refused.
func TestSQLiteDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	db, err := models.Open(ctx, models.Options{DataDir: dir})
	require.NoError(t, err)
	_, err = models.Open(ctx, models.Options{DataDir: dir})
	require.True(t, errors.Is(err, models.ErrDataDirLocked), "got %v", err)
	require.NoError(t, db.Close())
	again, err := models.Open(ctx, models.Options{DataDir: dir})
	require.NoError(t, err, "released on close")
	require.NoError(t, again.Close())
}

// The SQLite writer has a connection of its own: a write transaction runs
// while every connection of the readers' pool is taken, and never waits
// for one. In one shared pool the group commit's writer queued behind the
// readers (a fleet re-polling reads twice a poll) and database/sql hands a
// freed connection to a random waiter: issue 13's hold tail. The minute is
// a bound on a hang, not a timing: without the writer's own connection the
// transaction cannot start until a reader gives one back, and none does.
//
// The checkpointer runs on a reader connection too: it is put out of the
// test's window (an hour), or its tick would be the waiter counted.
func TestSQLiteWriterNeedsNoReadConnection(t *testing.T) {
	db, err := models.Open(ctx, models.Options{DataDir: t.TempDir(), MaxOpenConns: 2, CheckpointEvery: time.Hour})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Migrate(ctx))
	pool := db.SQL()
	var held []*sql.Conn
	for range 2 {
		c, err := pool.Conn(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	require.Equal(t, 2, pool.Stats().InUse, "every reader connection is taken")
	waits := pool.Stats().WaitCount

	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i := range 3 {
		err := db.Tx(tctx, func(tx *gorm.DB) error {
			return tx.Exec(`INSERT INTO node_state_counts(state, n) VALUES (?, ?)`, "ready", i).Error
		})
		require.NoError(t, err, "write %d", i)
	}
	require.Equal(t, waits, pool.Stats().WaitCount, "no write waited for a reader's connection")
	require.NotNil(t, db.WriterSQL())
	st := db.WriterSQL().Stats()
	require.Equal(t, 1, st.MaxOpenConnections)
	require.Zero(t, st.WaitCount, "writers queue on the writers lock, not for the connection")

	// What the writer committed, the readers see.
	for _, c := range held {
		_ = c.Close()
	}
	held = nil
	var n int64
	require.NoError(t, db.Raw(`SELECT COUNT(*) FROM node_state_counts WHERE state = 'ready'`).Scan(&n).Error)
	require.GreaterOrEqual(t, n, int64(3))
}
