package models

import (
	"context"
	"database/sql"

	"gorm.io/gorm"
)

// The command path's hot statements (the claim, the issue, the settlement)
// are fixed, hand-written text. Through GORM each of them also pays its
// statement builder, its callbacks, the reflective scan and the rendering
// of the whole statement with its values for the trace recorder (even with
// logging off): a tenth of the server's CPU at saturation. queryRows and
// execRows send such a statement straight to the connection or transaction
// g is bound to, with Postgres placeholders ($1, $2, …).

// queryRows runs query on g's connection or transaction; the caller closes
// the rows. An error already on g (a kept-back insert that failed,
// later.sendFirst) is answered instead.
func queryRows(g *gorm.DB, query string, args ...any) (*sql.Rows, error) {
	if g.Error != nil {
		return nil, g.Error
	}
	return g.Statement.ConnPool.QueryContext(statementContext(g), query, args...)
}

// execRows runs a statement answering no rows on g's connection or
// transaction and answers how many rows it changed.
func execRows(g *gorm.DB, query string, args ...any) (int64, error) {
	if g.Error != nil {
		return 0, g.Error
	}
	res, err := g.Statement.ConnPool.ExecContext(statementContext(g), query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// statementContext is the context GORM would have run g's statement with.
func statementContext(g *gorm.DB) context.Context {
	if g.Statement.Context != nil {
		return g.Statement.Context
	}
	return context.Background()
}
