package models

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	sqlite "modernc.org/sqlite"

	"github.com/nodeward/nodeward/errcode"
)

func init() { errcode.RegisterUnavailable(DatabaseUnavailable) }

// DatabaseUnavailable reports whether err says the database could not be
// reached or cannot take a write right now, rather than that the request
// was wrong or the code is: Postgres down, restarting or refusing
// connections (class 08, 57P01–57P03, too_many_connections), a connection
// lost mid-statement, or SQLite out of disk space or failing I/O. The HTTP
// edge answers these 503 unavailable; they pass once the database is back.
func DatabaseUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", // admin_shutdown
			pgErr.Code == "57P02", // crash_shutdown
			pgErr.Code == "57P03", // cannot_connect_now (starting up, recovering)
			pgErr.Code == "53300", // too_many_connections
			pgErr.Code == "53100": // disk_full
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() & 0xff {
		case 13, 10: // SQLITE_FULL, SQLITE_IOERR
			return true
		}
		return false
	}
	var netErr *net.OpError
	if errors.As(err, &netErr) {
		return true
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOSPC) {
		return true
	}
	// pgx reports a connection that died under a statement as "conn closed"
	// or an unexpected EOF without always wrapping a typed error.
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "unexpected EOF") ||
		strings.Contains(msg, "failed to connect to")
}
