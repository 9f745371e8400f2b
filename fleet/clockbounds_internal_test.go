package fleet

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// TestClockBoundsHoldTheSkew: the bounds in whole milliseconds always
// contain the true skew (node time − server time at the node's reading,
// somewhere between delivery and receipt), however the window's ends
// fall between milliseconds or on either side of zero; and the midpoint's
// uncertainty reaches both bounds.
func TestClockBoundsHoldTheSkew(t *testing.T) {
	delivered := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct{ window, ahead time.Duration }{
		{8175 * time.Microsecond, 5702 * time.Microsecond}, // bounds -2.473, 5.702 ms
		{5964 * time.Microsecond, 4560 * time.Microsecond},
		{2 * time.Second, 5 * time.Minute},
		{1500 * time.Microsecond, -700 * time.Microsecond}, // both bounds negative
		{0, 300 * time.Microsecond},
	} {
		received := delivered.Add(c.window)
		nodeTime := delivered.Add(c.ahead)
		ev, _ := json.Marshal(map[string]any{"action": "clock", "node_time": nodeTime})
		var got struct {
			Server api.ClockBounds `json:"server"`
		}
		if err := json.Unmarshal(withClockBounds(ev, delivered, received), &got); err != nil {
			t.Fatal(err)
		}
		b := got.Server
		lo, hi := nodeTime.Sub(received), nodeTime.Sub(delivered) // the true skew lies in [lo, hi]
		if time.Duration(b.SkewMinMs)*time.Millisecond > lo || time.Duration(b.SkewMaxMs)*time.Millisecond < hi {
			t.Errorf("window %s, ahead %s: bounds [%d, %d] ms do not hold [%s, %s]", c.window, c.ahead, b.SkewMinMs, b.SkewMaxMs, lo, hi)
		}
		if b.SkewMs-b.UncertaintyMs > b.SkewMinMs || b.SkewMs+b.UncertaintyMs < b.SkewMaxMs {
			t.Errorf("window %s, ahead %s: %d ± %d ms does not cover [%d, %d]", c.window, c.ahead, b.SkewMs, b.UncertaintyMs, b.SkewMinMs, b.SkewMaxMs)
		}
	}
}
