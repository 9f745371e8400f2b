// Package migrations owns the schema: versioned SQL per dialect, embedded in
// the binary and applied with goose at start and by `nodeward migrate`. The
// GORM models must agree with it; a test in models proves they do.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
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

// ErrAhead: the database holds migrations this build does not know — a
// newer release migrated it. Rows may then mean what this build cannot
// read (00030: a fan-out's children name a stored operation), so a build
// neither serves nor migrates such a database, nor rolls it back.
var ErrAhead = errors.New("the database was migrated by a newer release")

// Up applies every pending migration, each in its own transaction. It
// answers ErrAhead for a database a newer release migrated.
func Up(ctx context.Context, db *sql.DB, dialect string) error {
	p, err := provider(db, dialect)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", dialect, err)
	}
	return ahead(ctx, p)
}

// Current reports whether the database has every embedded migration, and
// ErrAhead (with false) when it has more.
func Current(ctx context.Context, db *sql.DB, dialect string) (bool, error) {
	p, err := provider(db, dialect)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, err
	}
	if pending {
		return false, nil
	}
	if err := ahead(ctx, p); err != nil {
		return false, err
	}
	return true, nil
}

// ahead answers ErrAhead when the database's newest migration is newer
// than this build's; it runs once nothing is pending, so the version
// table exists.
func ahead(ctx context.Context, p *goose.Provider) error {
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return err
	}
	if current > target {
		return fmt.Errorf("%w: the database is at migration %d, this build knows up to %d; run the newer release (stop every older replica first)",
			ErrAhead, current, target)
	}
	return nil
}
