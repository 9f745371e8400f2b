// Package migrations owns the schema: versioned SQL per dialect, embedded in
// the binary and applied with goose at start and by `nodeward migrate`. The
// GORM models must agree with it; a test in models proves they do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

//go:embed sqlite/*.sql postgres/*.sql
var files embed.FS

func provider(db *sql.DB, dialect string) (*goose.Provider, error) {
	var gd goose.Dialect
	switch dialect {
	case "sqlite":
		gd = goose.DialectSQLite3
	case "postgres":
		gd = goose.DialectPostgres
	default:
		return nil, fmt.Errorf("unknown dialect %q", dialect)
	}
	sub, err := fs.Sub(files, dialect)
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(gd, db, sub)
}

// Up applies every pending migration, each in its own transaction.
func Up(ctx context.Context, db *sql.DB, dialect string) error {
	p, err := provider(db, dialect)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", dialect, err)
	}
	return nil
}

// Current reports whether the database has every embedded migration.
func Current(ctx context.Context, db *sql.DB, dialect string) (bool, error) {
	p, err := provider(db, dialect)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, err
	}
	return !pending, nil
}
