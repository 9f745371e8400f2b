package ledger_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/ledger"
)

// TestRecordChunks: a fan-out's recording goes in transactions of at most
// a number of children and, past each one's first child, a number of
// bytes of operations, so children carrying a large document are
// recorded a few at a time and small ones many at a time — unless their
// kind writes a run's one document once.
func TestRecordChunks(t *testing.T) {
	children := func(sizes ...int) []ledger.Operation {
		out := make([]ledger.Operation, len(sizes))
		for i, n := range sizes {
			out[i] = ledger.Operation{ID: "c" + strconv.Itoa(i), Operation: []byte(strings.Repeat("x", n))}
		}
		return out
	}
	cases := []struct {
		name        string
		sizes       []int
		most, bytes int
		want        [][]string
	}{
		{"None", nil, 3, 100, nil},
		{"ByCount", []int{1, 1, 1, 1, 1, 1, 1}, 3, 100, [][]string{{"c0", "c1", "c2"}, {"c3", "c4", "c5"}, {"c6"}}},
		{"ByBytes", []int{40, 40, 40, 40, 40}, 10, 100, [][]string{{"c0", "c1"}, {"c2", "c3"}, {"c4"}}},
		{"ExactlyTheBytes", []int{50, 50, 50}, 10, 100, [][]string{{"c0", "c1"}, {"c2"}}},
		{"OneLargerThanTheBytesGoesAlone", []int{10, 500, 10, 10}, 10, 100, [][]string{{"c0"}, {"c1"}, {"c2", "c3"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ledger.RecordChunks(children(tc.sizes...), tc.most, tc.bytes, false))
		})
	}
	// A kind that records a run's one operation once (node.configure)
	// counts it once a run: 2 runs of one 60-byte operation go as one
	// transaction each, however many children carry them.
	op, other := []byte(strings.Repeat("x", 60)), []byte(strings.Repeat("y", 60))
	var shared []ledger.Operation
	for i, o := range [][]byte{op, op, op, other, other, other, op} {
		shared = append(shared, ledger.Operation{ID: "c" + strconv.Itoa(i), Operation: o})
	}
	require.Equal(t, [][]string{{"c0", "c1", "c2"}, {"c3", "c4", "c5"}, {"c6"}}, ledger.RecordChunks(shared, 10, 100, true))
	require.Equal(t, [][]string{{"c0"}, {"c1"}, {"c2"}, {"c3"}, {"c4"}, {"c5"}, {"c6"}}, ledger.RecordChunks(shared, 10, 100, false))
}

// A fan-out's first transaction runs in bulk when it may write much: a
// selector's (up to MaxFanOut children), over a thousand named nodes, or
// a large operation to many; a hundred named nodes stay in the lane.
func TestMayWriteMuch(t *testing.T) {
	nodes := func(n int) []ledger.Target {
		ts := make([]ledger.Target, n)
		for i := range ts {
			ts[i] = ledger.Target{Kind: ledger.TargetNode, ID: fmt.Sprint("n", i)}
		}
		return ts
	}
	small := json.RawMessage(`{"kind":"node.prepare_image","payload":{"image":"x"}}`)
	large := json.RawMessage(`{"document":"` + strings.Repeat("x", 250_000) + `"}`)
	for _, c := range []struct {
		name    string
		targets []ledger.Target
		op      json.RawMessage
		want    bool
	}{
		{"the fleet", []ledger.Target{{Kind: ledger.TargetFleet}}, small, true},
		{"100 nodes", nodes(100), small, false},
		{"1,001 nodes", nodes(1001), small, true},
		{"100 nodes, 250 KB", nodes(100), large, true},
		{"10 nodes, 250 KB", nodes(10), large, false},
	} {
		require.Equal(t, c.want, ledger.MayWriteMuch(ledger.Operation{Targets: c.targets, Operation: c.op}), c.name)
	}
}
