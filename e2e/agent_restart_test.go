package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// TestAgentServerRestart restarts the control plane under a real agent, on
// every dialect this run covers: a command recorded before the restart and
// never delivered arrives after it, and an agent that was connected through
// the restart reconnects on its own and applies work issued afterwards.
func TestAgentServerRestart(t *testing.T) {
	t.Parallel()
	for _, dialect := range dbtest.Dialects(t) {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			var o ServerOptions
			if dialect == models.Postgres {
				o.DatabaseURL = dbtest.NewSchema(t)
			}
			s := StartServer(t, o)
			f, b, a := enrolledAgent(t, s, "e2e-restart", AgentOptions{Name: "agent"})
			node := b.NodeID

			f.issue(node, api.KindLaunchWorkload, "restart-before", launchPayload("before", "exit 0", nil))
			f.waitApplied("restart-before", time.Minute)

			// 1. Recorded while the agent is down, then the server restarts
			// before anyone could deliver it: it survives in the database.
			if code := a.Stop(t); code != 0 {
				t.Fatalf("agent exit code after SIGTERM: %d, want 0", code)
			}
			f.issue(node, api.KindLaunchWorkload, "restart-pending", launchPayload("pending", "exit 0", nil))
			s.Stop(t, syscall.SIGTERM)
			if code := s.ExitCode(); code != 0 {
				t.Errorf("server exit code after SIGTERM: %d, want 0", code)
			}
			s.Start(t)
			if c := f.command("restart-pending"); c.State != "pending" || c.DeliveryCount != 0 {
				t.Fatalf("after the restart: restart-pending is %s, delivered %d times; want pending, never delivered", c.State, c.DeliveryCount)
			}
			a.Start(t)
			a.WaitLog(t, "session restored from state dir", time.Minute, nil)
			f.waitApplied("restart-pending", time.Minute)
			if w := f.waitWorkload(node, "pending", "a1", "exited", time.Minute); w.ExitCode == nil || *w.ExitCode != 0 {
				t.Errorf("pending: exit_code %v, want 0", w.ExitCode)
			}

			// 2. The server restarts under a connected agent, which
			// notices, backs off and comes back by itself.
			testwait.For(t, "the agent's long-poll to be held", time.Minute, func() bool { return f.sessionHeld(node) })
			s.Stop(t, syscall.SIGTERM)
			s.Start(t)
			testwait.For(t, "the agent to reconnect to the restarted server", 2*time.Minute, func() bool { return f.sessionHeld(node) })
			drained, failed := len(a.RunLogs("control plane asked to wait; polling again after its Retry-After")), len(a.RunLogs("poll failed; backing off"))
			if drained+failed == 0 {
				t.Errorf("the agent logged neither a draining answer nor a failed poll across the server restart")
			}
			t.Logf("across the restart the agent saw %d draining answers and %d failed polls", drained, failed)
			f.issue(node, api.KindLaunchWorkload, "restart-after", launchPayload("after", "exit 0", nil))
			f.waitApplied("restart-after", time.Minute)
			if w := f.waitWorkload(node, "after", "a1", "exited", time.Minute); w.ExitCode == nil || *w.ExitCode != 0 {
				t.Errorf("after: exit_code %v, want 0", w.ExitCode)
			}
			if n := f.node(node); n.State != "ready" {
				t.Errorf("node state %s after the restarts, want ready", n.State)
			}
			if code := a.Stop(t); code != 0 {
				t.Errorf("agent exit code after SIGTERM: %d, want 0", code)
			}
		})
	}
}
