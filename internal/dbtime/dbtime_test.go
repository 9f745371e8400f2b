package dbtime_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/dbtime"
)

func TestNorm(t *testing.T) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	in := time.Date(2026, 3, 1, 12, 0, 0, 123456789, zone)

	got := dbtime.Norm(in)
	require.Equal(t, time.UTC, got.Location(), "stored times are UTC")
	require.Equal(t, time.Date(2026, 3, 1, 6, 30, 0, 123456000, time.UTC), got, "truncated to the microsecond, same instant")
	require.False(t, got.After(in), "never rounded up into the future")
	require.Equal(t, got, dbtime.Norm(got), "normalising twice changes nothing")
	// Monotonic clock readings are dropped, so == and Equal agree.
	now := dbtime.Norm(time.Now())
	require.Equal(t, now, dbtime.Norm(now))

	require.Nil(t, dbtime.NormPtr(nil))
	p := dbtime.NormPtr(&in)
	require.Equal(t, got, *p)
	require.Equal(t, 123456789, in.Nanosecond(), "the argument is not changed")
}
