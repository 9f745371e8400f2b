package main

import (
	"math"
	"testing"
)

// TestHistogramQuantile: the window's observations are the difference of
// two scrapes of cumulative buckets, and the quantile falls inside the
// bucket that holds its rank, interpolated as Prometheus does; past the
// highest finite bound it answers that bound; nothing observed answers
// nothing.
func TestHistogramQuantile(t *testing.T) {
	key := func(le string) string { return `x_seconds_bucket{le="` + le + `"}` }
	before := map[string]float64{key("0.001"): 10, key("0.002"): 10, key("0.004"): 10, key("+Inf"): 10}
	// 100 observations in the window: 90 under 1 ms, 8 in (1, 2] ms, 2 in (2, 4] ms.
	after := map[string]float64{key("0.001"): 100, key("0.002"): 108, key("0.004"): 110, key("+Inf"): 110,
		"x_seconds_count": 110, "y_seconds_bucket{le=\"0.001\"}": 5}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

	n, v := histogramQuantile(before, after, "x_seconds", 0.99)
	if n != 100 || !near(v, 0.002+0.002*(99-98)/2) {
		t.Fatalf("p99 = %v of %v; want 0.003 of 100 (rank 99 halfway through the (2, 4] ms bucket)", v, n)
	}
	if _, v := histogramQuantile(before, after, "x_seconds", 0.5); !near(v, 0.001*50/90) {
		t.Fatalf("p50 = %v; want %v (inside the first bucket, from 0)", v, 0.001*50/90)
	}
	// Observations past the last finite bound answer that bound.
	after[key("+Inf")] = 130
	if n, v := histogramQuantile(before, after, "x_seconds", 0.99); n != 120 || v != 0.004 {
		t.Fatalf("p99 = %v of %v; want the highest finite bound, 0.004, of 120", v, n)
	}
	if n, v := histogramQuantile(after, after, "x_seconds", 0.99); n != 0 || v != 0 {
		t.Fatalf("nothing in the window: got %v of %v", v, n)
	}
	if n, v := histogramQuantile(before, after, "z_seconds", 0.99); n != 0 || v != 0 {
		t.Fatalf("no such histogram: got %v of %v", v, n)
	}
}
