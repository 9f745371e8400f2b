package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
)

func TestWorkloadOutput(t *testing.T) {
	t.Run("UploadedOnceAfterExitThroughAnOutage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.outputDown = 3 })
		b.start(b.cp.bootstrap())
		b.cp.push(launch("op-1", "run-1", "a1", "exit", "3"))
		b.eventually("the output, through the outage", 500*time.Millisecond, func() bool {
			return b.agent.Stats().OutputsDelivered == 1
		})
		b.cp.with(func() {
			require.Equal(t, api.OutputRequest{RunID: "run-1", AttemptID: "a1",
				StdoutTail: "run-1/a1: exit 3\n", StderrTail: "run-1/a1: simulated\n"}, b.cp.outputs["run-1/a1"])
			// A post whose answer is lost is sent again (the server keeps the
			// first); what must hold is that it was taken and is owed no more.
			require.GreaterOrEqual(t, b.cp.outputPosts, 1)
			require.Len(t, b.cp.outputs, 1)
		})
		require.Empty(t, b.store.OwedOutputs())
		require.Equal(t, "exited", states(b.cp.workloadEvents("run-1", "a1"))[2])
	})

	t.Run("OwedOutputUploadedAfterRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		bs := b.cp.bootstrap()
		b.cp.with(func() { b.cp.outputDown = 1 << 30 }) // down for this whole run
		b.start(bs)
		b.cp.push(launch("op-1", "run-1", "a1", "exit", "0"))
		// A flush that met the exit only at its output step failed there
		// and waits out its retry on the test's clock: advance it.
		b.eventually("the exit event", 100*time.Millisecond, func() bool { return len(b.cp.workloadEvents("run-1", "a1")) == 3 })
		require.Len(t, b.store.OwedOutputs(), 1)
		require.NoError(t, b.stop())

		b.cp.with(func() { b.cp.outputDown = 0 })
		b.start(bs)
		b.eventually("the output after the restart", 500*time.Millisecond, func() bool {
			return b.agent.Stats().OutputsDelivered == 1
		})
		b.cp.with(func() {
			require.Equal(t, "run-1/a1: exit 0\n", b.cp.outputs["run-1/a1"].StdoutTail)
			require.GreaterOrEqual(t, b.cp.outputPosts, 1, "a lost answer may send it again; the server keeps the first")
			require.Len(t, b.cp.outputs, 1)
		})
		require.Empty(t, b.store.OwedOutputs())
	})

	t.Run("RefusedOutputIsDroppedNotRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cp.with(func() { b.cp.refuseOutput = true })
		b.start(b.cp.bootstrap())
		b.cp.push(launch("op-1", "run-1", "a1", "exit", "0"))
		refused := func() []string {
			var out []string
			b.cp.with(func() { out = append(out, b.cp.outputRefuse...) })
			return out
		}
		b.eventually("the refusal", 0, func() bool { return len(refused()) == 1 })
		b.eventually("the owed output dropped", 0, func() bool { return len(b.store.OwedOutputs()) == 0 })
		// Later flushes do not send it again: the next output posted is
		// the next attempt's.
		b.cp.push(launch("op-2", "run-2", "a1", "exit", "0"))
		b.eventually("the second refusal", 0, func() bool { return len(refused()) >= 2 })
		require.Equal(t, []string{"run-1/a1", "run-2/a1"}, refused()[:2])
		require.Zero(t, b.agent.Stats().OutputsDelivered)
	})
}
