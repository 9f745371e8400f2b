package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// TestAgentKill9MidStream kills the agent with SIGKILL while a burst of
// commands is being applied and restarts it on the same state dir: every
// command ends applied, and every workload ran exactly once — each writes a
// line to a marker file named after its run, outside the state dir — and
// its output is readable through the API afterwards.
func TestAgentKill9MidStream(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	content := []byte("burst artifact\n")
	sum := sha256.Sum256(content)
	// The first download hangs until the agent dies, so at least one
	// operation is certainly caught between its intent and its answer.
	var downloads atomic.Int32
	hanging := make(chan struct{})
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if downloads.Add(1) == 1 {
			close(hanging)
			<-r.Context().Done()
			return
		}
		_, _ = w.Write(content)
	}))
	t.Cleanup(files.Close)

	f, b, a := enrolledAgent(t, s, "e2e-kill", AgentOptions{Name: "agent"})
	node := b.NodeID

	// The burst is recorded while the agent is down, so that it arrives in
	// one answer and is being applied all at once when the agent dies.
	if code := a.Stop(t); code != 0 {
		t.Fatalf("agent exit code after SIGTERM: %d, want 0", code)
	}
	markers := t.TempDir()
	const n = 20
	ops := []string{"burst-artifact"}
	f.issue(node, api.KindPrepareArtifact, "burst-artifact", api.PrepareArtifact{ArtifactID: "burst", URL: files.URL + "/burst.bin", SHA256: hex.EncodeToString(sum[:])})
	for i := range n {
		op := fmt.Sprintf("burst-launch-%02d", i)
		ops = append(ops, op)
		f.issue(node, api.KindLaunchWorkload, op, launchPayload(fmt.Sprintf("burst-%02d", i),
			`echo x >> "$MARKER_DIR/$NODEWARD_RUN_ID"; echo "ran $NODEWARD_RUN_ID"`, map[string]string{"MARKER_DIR": markers}))
	}

	a.Start(t)
	testwait.For(t, "the agent to apply a few of the burst and start the download", time.Minute, func() bool {
		select {
		case <-hanging:
		default:
			return false
		}
		return len(a.RunLogs("operation applied")) >= 3
	})
	a.Kill(t)
	appliedAtKill := 0
	for _, op := range ops {
		if f.command(op).State == "applied" {
			appliedAtKill++
		}
	}
	t.Logf("killed with %d of %d commands settled as applied on the server", appliedAtKill, len(ops))

	a.Start(t)
	a.WaitLog(t, "session restored from state dir", time.Minute, nil)
	// A command delivered but never recorded by the dead agent comes back
	// after the server's 60 s visibility timeout (DECISIONS §2); allow for it.
	for _, op := range ops {
		f.waitApplied(op, 5*time.Minute)
	}
	for i := range n {
		run := fmt.Sprintf("burst-%02d", i)
		w := f.waitWorkload(node, run, "a1", "exited", 2*time.Minute)
		if w.ExitCode == nil || *w.ExitCode != 0 {
			t.Errorf("%s: exit_code %v, want 0", run, w.ExitCode)
		}
		lines, err := readLines(markers + "/" + run)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(lines, []string{"x"}) {
			t.Errorf("%s ran %d times (marker %q), want exactly once", run, len(lines), lines)
		}
		// Its output arrives too, whether it exited before the kill or
		// its upload was still owed when the agent died.
		if o := f.waitOutput(node, run, "a1", time.Minute); o.StdoutTail != "ran "+run+"\n" || o.Truncated {
			t.Errorf("%s output: %+v; want stdout \"ran %s\\n\"", run, o, run)
		}
	}
	entries, err := os.ReadDir(markers)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != n {
		t.Errorf("%d marker files, want %d", len(entries), n)
	}
	rec := f.reconcile(node)
	if len(rec.Pending) != 0 {
		t.Errorf("reconciliation: pending %v, want none", rec.Pending)
	}
	resolved := a.RunLogs("resolving operation interrupted by the last shutdown")
	t.Logf("after the restart: %d interrupted operations resolved, %d redeliveries answered from the journal",
		len(resolved), len(a.RunLogs("redelivered command answered from the journal")))
	if !slices.ContainsFunc(resolved, func(r map[string]any) bool { return r["operation_id"] == "burst-artifact" }) {
		t.Errorf("the download interrupted by the kill was not resolved from its record at restart")
	}
	if n := downloads.Load(); n != 2 {
		t.Errorf("%d downloads, want 2 (the interrupted one, then its re-run)", n)
	}
	if code := a.Stop(t); code != 0 {
		t.Errorf("agent exit code after SIGTERM: %d, want 0", code)
	}
}
