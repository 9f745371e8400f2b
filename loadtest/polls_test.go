package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestFirstPollWaitSpread: a spread fleet's first poll waits cover every
// whole second from 1 s to the wait, and nothing else, so the fleet's
// re-polls are spread over the whole cycle rather than one wave.
func TestFirstPollWaitSpread(t *testing.T) {
	const wait = 25 * time.Second
	seen := map[time.Duration]int{}
	for range 5000 {
		d := firstPollWait(wait)
		if d < time.Second || d > wait || d%time.Second != 0 {
			t.Fatalf("first wait %v: want whole seconds from 1s to %v", d, wait)
		}
		seen[d]++
	}
	// 5,000 draws over 25 values: each is drawn about 200 times, and one
	// never drawn has a chance of 25 × (24/25)^5000, about 1e-87.
	if len(seen) != 25 {
		t.Fatalf("drew %d distinct waits, want all 25: %v", len(seen), seen)
	}
	for _, w := range []time.Duration{0, 500 * time.Millisecond, time.Second, 1900 * time.Millisecond} {
		if got := firstPollWait(w); got != w {
			t.Fatalf("firstPollWait(%v) = %v; under 2 s the wait is kept", w, got)
		}
	}
}

func TestHeldNeeded(t *testing.T) {
	for _, tc := range []struct {
		agents   int
		together bool
		want     int
	}{
		{20, false, 20}, {20, true, 20}, {2000, true, 2000}, {2000, false, 1980}, {15000, false, 14850},
	} {
		if got := heldNeeded(tc.agents, tc.together); got != tc.want {
			t.Fatalf("heldNeeded(%d, %v) = %d, want %d", tc.agents, tc.together, got, tc.want)
		}
	}
}

// TestPollsAnswered: the window's answered polls come from the poll
// route's 200s, the empty ones are those less the first deliveries.
func TestPollsAnswered(t *testing.T) {
	const polls = `nodeward_http_requests_total{method="GET",route="/agent/v1/commands",status="200"}`
	const delivered = "nodeward_command_delivery_latency_seconds_count"
	before := map[string]float64{polls: 100, delivered: 10}
	after := map[string]float64{polls: 1600, delivered: 510}
	if a, e := pollsAnswered(before, after); a != 1500 || e != 1000 {
		t.Fatalf("answered %v, empty %v; want 1500, 1000", a, e)
	}
	// Several commands in one answer: never fewer than no empty poll.
	after[delivered] = 2000
	if _, e := pollsAnswered(before, after); e != 0 {
		t.Fatalf("empty %v, want 0", e)
	}
}

// The bare waiter's count of held polls can time out while the fleet
// connects (TLS handshakes queue ahead of it): the hold run asks again
// rather than fail, and gives up only at its deadline, naming why.
func TestWaitHeldAsksAgainAfterAFailedCount(t *testing.T) {
	ctx := context.Background()
	answers := []error{errors.New("timeout awaiting headers"), errors.New("timeout awaiting headers"), nil}
	asked := 0
	held, err := waitHeld(ctx, 90, time.Minute, time.Millisecond, func(context.Context) (int, error) {
		err := answers[min(asked, len(answers)-1)]
		asked++
		if err != nil {
			return 0, err
		}
		return 95, nil
	})
	if err != nil || held != 95 || asked != 3 {
		t.Fatalf("waitHeld = %d, %v after %d counts; want 95, nil after 3", held, err, asked)
	}

	_, err = waitHeld(ctx, 90, 20*time.Millisecond, time.Millisecond, func(context.Context) (int, error) {
		return 0, errors.New("timeout awaiting headers")
	})
	if err == nil || !strings.Contains(err.Error(), "timeout awaiting headers") {
		t.Fatalf("a count that never answers: %v; want the deadline's error naming the last failure", err)
	}
	_, err = waitHeld(ctx, 90, 20*time.Millisecond, time.Millisecond, func(context.Context) (int, error) { return 10, nil })
	if err == nil || !strings.Contains(err.Error(), "only 10 of 90") {
		t.Fatalf("too few held: %v; want the deadline's error with the count", err)
	}
}

// TestMergeReplicaMetrics: over several replicas counters add up, while a
// GC percent and a pause quantile are the highest replica's, not a sum
// that no process had (three replicas once read "GC percent 193").
func TestMergeReplicaMetrics(t *testing.T) {
	out := map[string]float64{}
	for _, m := range []map[string]float64{
		{"nodeward_gc_percent": 100, `go_gc_duration_seconds{quantile="1"}`: 0.040, "nodeward_lease_renewals_flushed_total": 10},
		{"nodeward_gc_percent": 43, `go_gc_duration_seconds{quantile="1"}`: 0.070, "nodeward_lease_renewals_flushed_total": 20},
		{"nodeward_gc_percent": 50, `go_gc_duration_seconds{quantile="1"}`: 0.010, "nodeward_lease_renewals_flushed_total": 5},
	} {
		mergeReplicaMetrics(out, m)
	}
	for k, want := range map[string]float64{"nodeward_gc_percent": 100, `go_gc_duration_seconds{quantile="1"}`: 0.070,
		"nodeward_lease_renewals_flushed_total": 35} {
		if out[k] != want {
			t.Errorf("%s = %v, want %v", k, out[k], want)
		}
	}
}
