// Package dbtime is the one rule for a time that is stored or compared with
// a stored one: UTC, at microsecond precision.
//
// UTC because SQLite keeps times as text and compares them as text, so two
// zones would order wrongly. Microseconds because that is what Postgres
// keeps: a time answered to a caller must equal what a later read returns.
package dbtime

import "time"

// Norm answers t in UTC, truncated (never rounded, so it never moves into
// the future) to the microsecond.
func Norm(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// NormPtr is Norm for an optional time; nil stays nil.
func NormPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := Norm(*t)
	return &v
}
