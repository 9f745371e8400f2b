package models_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

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
