package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// TestAgentHappyPath enrolls a real agent (process runtime) and drives it
// through the admin API: an artifact verified by digest, one refused for a
// wrong digest, workloads whose exits come back as events, and the node's
// facts and heartbeat.
func TestAgentHappyPath(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})

	content := []byte("nodeward e2e artifact\n")
	sum := sha256.Sum256(content)
	good := hex.EncodeToString(sum[:])
	other := sha256.Sum256([]byte("not the artifact"))
	wrong := hex.EncodeToString(other[:])
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tool.bin" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(content)
	}))
	t.Cleanup(files.Close)

	f, b, a := enrolledAgent(t, s, "e2e-happy", AgentOptions{Name: "agent"})
	node := b.NodeID

	// A verified artifact lands in the content-addressed cache.
	f.issue(node, api.KindPrepareArtifact, "happy-artifact-ok", api.PrepareArtifact{ArtifactID: "tool", URL: files.URL + "/tool.bin", SHA256: good})
	f.waitApplied("happy-artifact-ok", time.Minute)
	if got, err := os.ReadFile(filepath.Join(a.StateDir, "artifacts", "sha256", good)); err != nil || string(got) != string(content) {
		t.Errorf("cached artifact: %q, %v; want the served bytes", got, err)
	}

	// A wrong digest is refused, naming both digests.
	f.issue(node, api.KindPrepareArtifact, "happy-artifact-bad", api.PrepareArtifact{ArtifactID: "tool-bad", URL: files.URL + "/tool.bin", SHA256: wrong})
	bad := f.waitSettled("happy-artifact-bad", time.Minute)
	if bad.State != "refused" {
		t.Fatalf("wrong digest: state %s, want refused", bad.State)
	}
	if !strings.Contains(bad.FailureMessage, good) || !strings.Contains(bad.FailureMessage, wrong) {
		t.Errorf("wrong digest: failure_message %q should name the expected %s and the downloaded %s", bad.FailureMessage, wrong, good)
	}
	if _, err := os.Stat(filepath.Join(a.StateDir, "artifacts", "sha256", wrong)); err == nil {
		t.Errorf("the cache holds bytes under a digest they do not hash to")
	}

	// Workloads: launched, then their exits observed through the API.
	f.issue(node, api.KindLaunchWorkload, "happy-launch-hi", launchPayload("hello", "echo hi; exit 0", nil))
	f.issue(node, api.KindLaunchWorkload, "happy-launch-3", launchPayload("three",
		"head -c 70000 /dev/zero | tr '\\0' z; echo; echo end; echo bad >&2; exit 3", nil))
	f.waitApplied("happy-launch-hi", time.Minute)
	f.waitApplied("happy-launch-3", time.Minute)
	w := f.waitWorkload(node, "hello", "a1", "exited", time.Minute)
	if w.ExitCode == nil || *w.ExitCode != 0 {
		t.Errorf("hello: exit_code %v, want 0", w.ExitCode)
	}
	w = f.waitWorkload(node, "three", "a1", "exited", time.Minute)
	if w.ExitCode == nil || *w.ExitCode != 3 {
		t.Errorf("three: exit_code %v, want 3", w.ExitCode)
	}
	if out, err := os.ReadFile(filepath.Join(a.StateDir, "workloads", "hello", "attempts", "a1", "stdout.log")); err != nil || string(out) != "hi\n" {
		t.Errorf("hello stdout: %q, %v; want \"hi\\n\"", out, err)
	}
	a.WaitLog(t, "workload", time.Minute, func(r map[string]any) bool {
		return r["run_id"] == "three" && r["state"] == "exited" && r["exit_code"] == float64(3)
	})

	// Their output, uploaded after the exits, read through the API: the
	// last 64 KiB of each stream.
	out := f.waitOutput(node, "hello", "a1", time.Minute)
	if out.StdoutTail != "hi\n" || out.StderrTail != "" || out.Truncated {
		t.Errorf("hello output: %+v; want stdout \"hi\\n\", nothing else", out)
	}
	out = f.waitOutput(node, "three", "a1", time.Minute)
	if len(out.StdoutTail) != api.MaxOutputTail || !strings.HasSuffix(out.StdoutTail, "zzz\nend\n") || out.StderrTail != "bad\n" || !out.Truncated {
		t.Errorf("three output: %d bytes of stdout ending %q, stderr %q, truncated %v; want the last 64 KiB ending \"end\\n\", \"bad\\n\", true",
			len(out.StdoutTail), out.StdoutTail[max(0, len(out.StdoutTail)-16):], out.StderrTail, out.Truncated)
	}

	// Facts and heartbeat, with the disk measured.
	n := f.node(node)
	if n.State != "ready" || n.LastHeartbeatAt == nil {
		t.Errorf("node: state %s, last_heartbeat_at %v; want ready with a heartbeat", n.State, n.LastHeartbeatAt)
	}
	if n.Facts == nil || n.Facts.Hostname == "" || n.Facts.CPUs < 1 || !slices.Contains(n.Facts.Runtimes, "process") {
		t.Errorf("node facts: %+v; want hostname, cpus and the process runtime", n.Facts)
	}
	if n.Disk.State != "measured" || n.Disk.FreeBytes == nil || *n.Disk.FreeBytes <= 0 {
		t.Errorf("node disk: %+v; want measured with free bytes", n.Disk)
	}

	// Reconciliation tells a control plane what not to do again.
	rec := f.reconcile(node)
	for _, op := range []string{"happy-artifact-ok", "happy-launch-hi", "happy-launch-3"} {
		if !slices.Contains(rec.Applied, op) {
			t.Errorf("reconciliation: applied %v lacks %s", rec.Applied, op)
		}
	}
	if len(rec.Pending) != 0 {
		t.Errorf("reconciliation: pending %v, want none", rec.Pending)
	}
	testwait.For(t, "the agent's long-poll to be listed", time.Minute, func() bool { return f.sessionHeld(node) })

	if code := a.Stop(t); code != 0 {
		t.Errorf("agent exit code after SIGTERM: %d, want 0", code)
	}
	// A refusal the server recorded is settled, not a result it declined.
	if recs := a.Logs("server will not settle result"); len(recs) != 0 {
		t.Errorf("the agent took settled results for unsettleable ones: %v", recs)
	}
}
