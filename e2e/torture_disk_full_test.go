package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/internal/testwait"
)

// mountTmpfs mounts a size-limited tmpfs (a disk that can fill up) and
// answers its path; it skips the test where mounting is not allowed.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nodeward-full-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir).CombinedOutput(); err != nil {
		_ = os.Remove(dir)
		t.Skipf("cannot mount a size-limited tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("umount", "-l", dir).Run()
		_ = os.Remove(dir)
	})
	return dir
}

// fillerName is the file fill grows; removing it gives the space back.
const fillerName = "filler"

// fill appends to dir's filler file until the filesystem is full and
// answers how many bytes it took (0: already full).
func fill(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, fillerName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	var took int64
	for {
		n, err := f.Write(chunk)
		took += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return took
		}
	}
}

// TestTortureDiskFull fills the disk under the agent's state directory and
// under the server's SQLite data folder. The agent refuses work it cannot
// record rather than applying it unrecorded, and applies it exactly once
// when space returns; the server answers writes 503 while its disk is full,
// records nothing half-written, and takes writes again when space returns.
func TestTortureDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a size-limited tmpfs needs root")
	}
	fig := &Figures{Fault: "disk full (agent state dir, server SQLite folder)", Cycles: 2, Codes: map[string]int{}}

	t.Run("agent", func(t *testing.T) {
		s := StartServer(t, ServerOptions{})
		disk := mountTmpfs(t, "4m")
		f, b, a := enrolledAgent(t, s, "torture-full-agent", AgentOptions{Name: "agent", StateDir: filepath.Join(disk, "state"), Args: []string{"--runtime", "simulated"}})
		node := b.NodeID
		// The disk must stay full while full-1 arrives: a spool entry
		// written before the fill and deleted once acknowledged would free
		// the very pages the launch's record then takes, and the launch
		// would be applied. So fill, wait for the spool to drain (nothing
		// new can be spooled on a full disk), and top up until a top-up
		// finds no page freed since the last one.
		spool := filepath.Join(disk, "state", "spool")
		spoolDrained := func() bool {
			entries, err := os.ReadDir(spool)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".json") {
					return false
				}
			}
			return true
		}
		fill(t, disk)
		testwait.For(t, "the agent's spool to drain with its disk full", time.Minute, func() bool {
			return spoolDrained() && fill(t, disk) == 0 && spoolDrained()
		})
		f.issue(node, api.KindLaunchWorkload, "full-1", api.LaunchWorkload{RunID: "full-1", AttemptID: "a1", Command: "exit", Args: []string{"0"}})
		testwait.For(t, "the agent to be handed full-1 and refuse it", 2*time.Minute, func() bool {
			for _, msg := range []string{"cannot record operation; not applying it", "operation applied", "operation refused"} {
				for _, r := range a.Logs(msg) {
					if r["operation_id"] == "full-1" {
						if msg != "cannot record operation; not applying it" {
							t.Fatalf("with its disk full the agent logged %q for full-1", msg)
						}
						return true
					}
				}
			}
			return false
		})
		if n := len(a.Logs("workload launched")); n != 0 {
			t.Errorf("the agent launched %d workloads it could not record", n)
		}
		if c := f.command("full-1"); c.State != "pending" {
			t.Errorf("full-1 with the agent's disk full: %s, want pending", c.State)
		}
		fig.Codes["agent: not applied, unrecordable"]++
		if err := os.Remove(filepath.Join(disk, fillerName)); err != nil {
			t.Fatal(err)
		}
		freed := time.Now()
		// The server hands it out again after its visibility timeout (60 s).
		f.waitApplied("full-1", 5*time.Minute)
		fig.Recovered(time.Since(freed))
		verifyExactlyOnce(t, fig, s.URL, s.Token, []issued{{ID: "full-1", Node: node, Run: "full-1"}}, map[string]string{node: a.StateDir}, launchCounts(a))
	})

	t.Run("server", func(t *testing.T) {
		disk := mountTmpfs(t, "48m")
		s := StartServer(t, ServerOptions{DataDir: filepath.Join(disk, "data")})
		f := fleetAPI{t: t, s: s}
		b, _ := enrollNode(t, s)
		node := b.NodeID
		fill(t, disk)
		var refused []string
		for i := range 5 {
			id := fmt.Sprintf("server-full-%d", i)
			status, raw := s.Call(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands",
				map[string]any{"kind": api.KindStopWorkload, "operation_id": id, "payload": map[string]any{"run_id": "r", "attempt_id": "a", "grace_seconds": 1}}, s.Token)
			fig.Codes[fmt.Sprintf("server write: %d %s", status, ProblemCode(raw))]++
			switch status {
			case http.StatusServiceUnavailable:
				refused = append(refused, id)
			case http.StatusCreated:
				// SQLite may still find room in pages it owns; fine.
			default:
				t.Errorf("%s with the disk full: %d %s, want 503 (or 201 if it fit)", id, status, raw)
			}
		}
		if len(refused) == 0 {
			t.Fatalf("no write was refused with the disk full")
		}
		// Reads still answer.
		if status, raw := s.Call(t, http.MethodGet, "/api/v1/nodes/"+node, nil, s.Token); status != http.StatusOK {
			t.Errorf("a read with the disk full: %d %s", status, raw)
		}
		if err := os.Remove(filepath.Join(disk, fillerName)); err != nil {
			t.Fatal(err)
		}
		freed := time.Now()
		// Nothing refused was half-written, and the same request now
		// succeeds once.
		for _, id := range refused {
			if status, raw := s.Call(t, http.MethodGet, "/api/v1/commands/"+id, nil, s.Token); status != http.StatusNotFound {
				t.Errorf("%s was refused 503 yet recorded: %d %s", id, status, raw)
			}
		}
		testwait.For(t, "writes to be taken again", time.Minute, func() bool {
			status, _ := s.Call(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands",
				map[string]any{"kind": api.KindStopWorkload, "operation_id": refused[0], "payload": map[string]any{"run_id": "r", "attempt_id": "a", "grace_seconds": 1}}, s.Token)
			return status == http.StatusCreated
		})
		fig.Recovered(time.Since(freed))
		if c := f.command(refused[0]); c.State != "pending" {
			t.Errorf("%s after space returned: %s, want pending", refused[0], c.State)
		}
		// The server survives a restart on that folder (the database is
		// intact).
		s.Stop(t, syscall.SIGTERM)
		s.Start(t)
		if c := f.command(refused[0]); c.State != "pending" {
			t.Errorf("%s after a restart: %s", refused[0], c.State)
		}
	})
	fig.Notes = append(fig.Notes, "the agent's recovery includes the server's 60 s visibility timeout: a command the agent could not record is handed out again only after it (DECISIONS §2)")
	fig.Report(t)
}
