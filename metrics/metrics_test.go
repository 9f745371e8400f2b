package metrics_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/internal/testclock"
	"github.com/nodeward/nodeward/metrics"
)

// setup answers metrics whose store-backed gauges count their reads and
// answer what lagging and states hold at the read.
func setup(t *testing.T) (m *metrics.Metrics, clock *testclock.Clock, reads *atomic.Int64, lagging *atomic.Int64, fail *atomic.Bool) {
	t.Helper()
	m = metrics.New(nil)
	clock = testclock.New(time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC))
	m.Now = clock.Now
	reads, lagging, fail = &atomic.Int64{}, &atomic.Int64{}, &atomic.Bool{}
	m.ConfigLagging = func() (float64, bool) {
		reads.Add(1)
		if fail.Load() {
			return 0, false
		}
		return float64(lagging.Load()), true
	}
	m.OperationStates = func() (map[string]float64, bool) {
		reads.Add(1)
		if fail.Load() {
			return nil, false
		}
		return map[string]float64{"pending": float64(lagging.Load())}, true
	}
	return m, clock, reads, lagging, fail
}

func laggingGauge(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	n, err := testutil.GatherAndCount(m.Registry, "nodeward_config_lagging_nodes")
	require.NoError(t, err)
	if n == 0 {
		return -1 // not exported (the read failed)
	}
	mfs, err := m.Registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "nodeward_config_lagging_nodes" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestStoreGaugesReadAtMostOncePerInterval: however often /metrics is
// scraped, the fleet-wide counts are read from the store at most once per
// StoreReadInterval; a scrape within it answers the last read's figures,
// and the first scrape after it reads again.
func TestStoreGaugesReadAtMostOncePerInterval(t *testing.T) {
	m, clock, reads, lagging, _ := setup(t)
	lagging.Store(3)
	require.Equal(t, 3.0, laggingGauge(t, m))
	require.Equal(t, int64(2), reads.Load(), "each gauge read once (every Gather collects both)")

	lagging.Store(5)
	for range 10 {
		clock.Advance(metrics.StoreReadInterval / 20)
		require.Equal(t, 3.0, laggingGauge(t, m), "within the interval: the last read's figure")
	}
	require.Equal(t, int64(2), reads.Load(), "ten scrapes within the interval read nothing")

	clock.Advance(metrics.StoreReadInterval)
	require.Equal(t, 5.0, laggingGauge(t, m))
	require.Equal(t, int64(4), reads.Load())
}

// TestStoreGaugesFailedReadIsNotKept: a read the store could not answer
// exports nothing and is tried again by the next scrape, whatever the
// interval.
func TestStoreGaugesFailedReadIsNotKept(t *testing.T) {
	m, _, reads, lagging, fail := setup(t)
	lagging.Store(2)
	fail.Store(true)
	require.Equal(t, -1.0, laggingGauge(t, m), "a failed read exports no figure")
	fail.Store(false)
	require.Equal(t, 2.0, laggingGauge(t, m), "the next scrape reads again")
	require.Equal(t, int64(4), reads.Load())
}

// TestStoreGaugesConcurrentScrapesShareARead: scrapes at the same moment
// wait for one read instead of each reading.
func TestStoreGaugesConcurrentScrapesShareARead(t *testing.T) {
	m, _, reads, lagging, _ := setup(t)
	lagging.Store(1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			_, err := m.Registry.Gather()
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, int64(2), reads.Load(), "one read per gauge for 16 concurrent scrapes")
}
