package fleet_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/fleet"
)

// TestOutputScrubbed: the scrubber sees an attempt's output before it is
// stored, so what it removes never reaches the database; a scrubber that
// fails stores nothing. (Today's default removes nothing: nodes hold no
// secrets yet.)
func TestOutputScrubbed(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess, _ := b.readyNode(t)
		scrubbing := fleet.New(fleet.Options{Store: b.store, Keys: b.ring, Settings: b.svc.Settings(), Now: b.clock.Now,
			Metrics: b.metrics, Logger: slog.New(slog.DiscardHandler),
			ScrubOutput: func(_ context.Context, o fleet.WorkloadOutput) (fleet.WorkloadOutput, error) {
				if o.RunID == "broken" {
					return o, errors.New("cannot look up the launch")
				}
				o.StdoutTail = strings.ReplaceAll(o.StdoutTail, "hunter2", "[sealed]")
				o.StderrTail = strings.ReplaceAll(o.StderrTail, "hunter2", "[sealed]")
				return o, nil
			}})

		recorded, err := scrubbing.RecordOutput(ctx, sess, api.OutputRequest{RunID: "r", AttemptID: "a",
			StdoutTail: "password=hunter2\n", StderrTail: "hunter2 rejected\n"})
		require.NoError(t, err)
		require.True(t, recorded)
		got, err := b.svc.WorkloadOutput(ctx, node, "r", "a")
		require.NoError(t, err)
		require.Equal(t, "password=[sealed]\n", got.StdoutTail)
		require.Equal(t, "[sealed] rejected\n", got.StderrTail)

		_, err = scrubbing.RecordOutput(ctx, sess, api.OutputRequest{RunID: "broken", AttemptID: "a", StdoutTail: "hunter2"})
		require.Error(t, err)
		_, err = b.svc.WorkloadOutput(ctx, node, "broken", "a")
		requireCode(t, err, fleet.ErrOutputNotFound)
	})
}

// TestOutputDefaultKeepsBytes: without secrets, output is stored exactly as
// the node sent it, and the first report of an attempt is kept.
func TestOutputDefaultKeepsBytes(t *testing.T) {
	each(t, func(t *testing.T, b *bundle) {
		node, sess, _ := b.readyNode(t)
		text := "ünïcode ☃ \t tabs\r\nand a U+FFFD: \uFFFD\n"
		recorded, err := b.svc.RecordOutput(ctx, sess, api.OutputRequest{RunID: "r", AttemptID: "a", StdoutTail: text, Truncated: true})
		require.NoError(t, err)
		require.True(t, recorded)
		recorded, err = b.svc.RecordOutput(ctx, sess, api.OutputRequest{RunID: "r", AttemptID: "a", StdoutTail: "second"})
		require.NoError(t, err)
		require.False(t, recorded)
		got, err := b.svc.WorkloadOutput(ctx, node, "r", "a")
		require.NoError(t, err)
		require.Equal(t, text, got.StdoutTail)
		require.True(t, got.Truncated)
		require.Equal(t, b.clock.Now().UTC(), got.ReceivedAt)

		_, err = b.svc.WorkloadOutput(ctx, "no-such-node", "r", "a")
		requireCode(t, err, fleet.ErrNotFound)
	})
}
