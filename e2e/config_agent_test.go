package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// Desired configuration end to end (issue 11): the real agent binary, with
// a real --config-hook, against the real server binary.

// configOp is the part of a configure operation these tests read.
type configOp struct {
	OperationID string `json:"operation_id"`
	Kind        string `json:"kind"`
	State       string `json:"state"`
	Error       *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Result *struct {
		Revision int64  `json:"revision"`
		Hash     string `json:"hash"`
		State    string `json:"state"`
	} `json:"result"`
	Counts *struct {
		Total     int `json:"total"`
		Succeeded int `json:"succeeded"`
		Failed    int `json:"failed"`
		Cancelled int `json:"cancelled"`
		Pending   int `json:"pending"`
	} `json:"counts"`
}

// nodeConfig is GET /api/v1/nodes/{id}/config.
type nodeConfig struct {
	Desired *struct {
		Revision int64           `json:"revision"`
		Hash     string          `json:"hash"`
		Format   string          `json:"format"`
		Document json.RawMessage `json:"document"`
	} `json:"desired"`
	Reported *struct {
		Revision int64  `json:"revision"`
		State    string `json:"state"`
		Message  string `json:"message"`
	} `json:"reported"`
	AppliedRevision int64  `json:"applied_revision"`
	Verdict         string `json:"verdict"`
	Lagging         bool   `json:"lagging"`
}

// hook is a --config-hook script over a directory of its own: every run
// appends "<revision>" to runs; a file fail makes it print its content and
// exit 1; a file block makes the first run that sees it wait (its pid in
// blocked.pid) until release exists.
type hook struct {
	dir, path string
}

func newHook(t *testing.T) hook {
	t.Helper()
	dir := t.TempDir()
	h := hook{dir: dir, path: filepath.Join(dir, "hook.sh")}
	script := fmt.Sprintf(`#!/bin/sh
d=%q
echo "$NODEWARD_CONFIG_REVISION" >> "$d/runs"
if [ -f "$d/block" ] && [ ! -f "$d/blocked-once" ]; then
	touch "$d/blocked-once"
	echo $$ > "$d/blocked.pid"
	while [ ! -f "$d/release" ]; do sleep 0.05; done
fi
if [ -f "$d/fail" ]; then cat "$d/fail"; exit 1; fi
echo "applied $1"
`, dir)
	if err := os.WriteFile(h.path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.touch(t, "release") }) // no hook is left waiting
	return h
}

func (h hook) touch(t testing.TB, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.dir, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h hook) write(t testing.TB, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h hook) remove(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(h.dir, name)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// runsOf answers how many times the hook ran for revision.
func (h hook) runsOf(t testing.TB, revision int64) int {
	t.Helper()
	lines, err := readLines(filepath.Join(h.dir, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range lines {
		if l == strconv.FormatInt(revision, 10) {
			n++
		}
	}
	return n
}

func (h hook) allRuns(t testing.TB) int {
	t.Helper()
	lines, err := readLines(filepath.Join(h.dir, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	return len(lines)
}

// configure submits node.configure and answers the operation.
func configure(t testing.TB, s *Server, requestID, node string, document any, force bool) configOp {
	t.Helper()
	o := map[string]any{"format": "e2e/v1", "document": document}
	if force {
		o["force"] = true
	}
	var op configOp
	s.API(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": requestID, "kind": "node.configure",
		"targets": []any{map[string]any{"kind": "node", "id": node}}, "operation": o}, http.StatusCreated, &op)
	return op
}

func readConfigOp(t testing.TB, s *Server, id string) configOp {
	t.Helper()
	var op configOp
	s.API(t, http.MethodGet, "/api/v1/operations/"+id, nil, http.StatusOK, &op)
	return op
}

// awaitConfigOp waits until the operation ended and answers it.
func awaitConfigOp(t testing.TB, s *Server, id string, timeout time.Duration) configOp {
	t.Helper()
	var op configOp
	testwait.For(t, "operation "+id+" to end", timeout, func() bool {
		op = readConfigOp(t, s, id)
		return op.State == "succeeded" || op.State == "failed" || op.State == "cancelled"
	}, func() string { b, _ := json.Marshal(op); return "last seen: " + string(b) })
	return op
}

func readNodeConfig(t testing.TB, s *Server, node string) nodeConfig {
	t.Helper()
	var c nodeConfig
	s.API(t, http.MethodGet, "/api/v1/nodes/"+node+"/config", nil, http.StatusOK, &c)
	return c
}

// onNode answers the node's config/current.json, parsed.
func onNode(t testing.TB, a *Agent) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(a.StateDir, "config", "current.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("current.json: %v: %s", err, raw)
	}
	return doc
}

func requireApplied(t testing.TB, s *Server, node string, revision int64) nodeConfig {
	t.Helper()
	c := readNodeConfig(t, s, node)
	if c.Desired == nil || c.Desired.Revision != revision || c.Verdict != "applied" || c.AppliedRevision != revision || c.Lagging {
		b, _ := json.Marshal(c)
		t.Fatalf("node config: %s; want revision %d applied", b, revision)
	}
	return c
}

func serverOptions(t *testing.T, dialect string) ServerOptions {
	var o ServerOptions
	if dialect == models.Postgres {
		o.DatabaseURL = dbtest.NewSchema(t)
	}
	return o
}

// TestConfigAgentEndToEnd: set, change, a failing hook (not pushed again
// until forced), on every dialect this run covers.
func TestConfigAgentEndToEnd(t *testing.T) {
	t.Parallel()
	for _, dialect := range dbtest.Dialects(t) {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			s := StartServer(t, serverOptions(t, dialect))
			h := newHook(t)
			_, b, a := enrolledAgent(t, s, "e2e-config", AgentOptions{Name: "agent", Args: []string{"--config-hook", h.path}})
			node := b.NodeID

			// (a) set: written on the node, the hook ran once, the verdict
			// and the operation say applied.
			op := configure(t, s, "cfg-set", node, map[string]any{"site": "a", "port": 80}, false)
			if got := awaitConfigOp(t, s, op.OperationID, time.Minute); got.State != "succeeded" || got.Result == nil || got.Result.Revision != 1 {
				t.Fatalf("set: %+v", got)
			}
			requireApplied(t, s, node, 1)
			if doc := onNode(t, a); doc["site"] != "a" || doc["port"] != float64(80) {
				t.Fatalf("current.json: %v", doc)
			}
			if n := h.runsOf(t, 1); n != 1 {
				t.Fatalf("hook ran %d times for revision 1, want 1", n)
			}

			// The same document again writes nothing and ends at once.
			if again := configure(t, s, "cfg-set-again", node, map[string]any{"port": 80, "site": "a"}, false); again.State != "succeeded" {
				t.Fatalf("unchanged document: %+v; want succeeded at once", again)
			}

			// (b) change: the next revision is applied.
			op = configure(t, s, "cfg-change", node, map[string]any{"site": "b", "port": 81}, false)
			if got := awaitConfigOp(t, s, op.OperationID, time.Minute); got.State != "succeeded" || got.Result == nil || got.Result.Revision != 2 {
				t.Fatalf("change: %+v", got)
			}
			requireApplied(t, s, node, 2)
			if doc := onNode(t, a); doc["site"] != "b" {
				t.Fatalf("current.json after the change: %v", doc)
			}

			// (c) a failing hook: failed with the hook's message, and not
			// pushed again until forced.
			h.write(t, "fail", "nginx: bad directive on line 3\n")
			op = configure(t, s, "cfg-fail", node, map[string]any{"site": "c"}, false)
			got := awaitConfigOp(t, s, op.OperationID, time.Minute)
			if got.State != "failed" || got.Error == nil || got.Error.Code != "config_failed" || !strings.Contains(got.Error.Message, "nginx: bad directive on line 3") {
				t.Fatalf("failing hook: %+v", got)
			}
			if c := readNodeConfig(t, s, node); c.Verdict != "failed" || c.AppliedRevision != 2 || !c.Lagging {
				t.Fatalf("after the failure: %+v; want verdict failed, applied 2, lagging", c)
			}
			if n := h.runsOf(t, 3); n != 1 {
				t.Fatalf("hook ran %d times for revision 3, want 1", n)
			}
			// Several long-polls later (each answers within --poll-wait 5s)
			// the revision was not pushed again.
			s.API(t, http.MethodPost, "/api/v1/nodes/"+node+"/commands", map[string]any{"kind": "launch_workload", "operation_id": "cfg-tick",
				"payload": launchPayload("tick", "exit 0", nil)}, http.StatusCreated, nil)
			fleetAPI{t: t, s: s}.waitApplied("cfg-tick", time.Minute)
			if n := h.runsOf(t, 3); n != 1 || len(a.RunLogs("configuration that failed delivered again: applying it again")) != 0 {
				t.Fatalf("a failed revision was pushed again without force: hook ran %d times", n)
			}
			// The same document without force ends failed at once.
			if again := configure(t, s, "cfg-fail-again", node, map[string]any{"site": "c"}, false); again.State != "failed" || again.Error == nil || again.Error.Code != "config_failed" {
				t.Fatalf("resubmitted failed document: %+v; want failed at once", again)
			}
			if n := h.runsOf(t, 3); n != 1 {
				t.Fatalf("hook ran %d times for revision 3 after an unforced resubmit, want 1", n)
			}
			// Forced: run again, and now it applies.
			h.remove(t, "fail")
			op = configure(t, s, "cfg-force", node, map[string]any{"site": "c"}, true)
			if got := awaitConfigOp(t, s, op.OperationID, time.Minute); got.State != "succeeded" || got.Result == nil || got.Result.Revision != 3 {
				t.Fatalf("forced: %+v", got)
			}
			if n := h.runsOf(t, 3); n != 2 {
				t.Fatalf("hook ran %d times for revision 3 after force, want 2", n)
			}
			requireApplied(t, s, node, 3)
			if code := a.Stop(t); code != 0 {
				t.Errorf("agent exit code after SIGTERM: %d, want 0", code)
			}
		})
	}
}

// TestConfigAgentKilledWhileApplying (d): the agent is killed with SIGKILL
// while its hook runs (the document written, nothing reported); restarted,
// it converges and the hook ran at most twice for the revision.
func TestConfigAgentKilledWhileApplying(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	h := newHook(t)
	_, b, a := enrolledAgent(t, s, "e2e-config-kill", AgentOptions{Name: "agent", Args: []string{"--config-hook", h.path}})
	node := b.NodeID
	h.touch(t, "block")
	op := configure(t, s, "cfg-kill", node, map[string]any{"k": 1}, false)
	testwait.For(t, "the hook to be running", time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(h.dir, "blocked.pid"))
		return err == nil
	})
	// Delivered, not yet reported: running (accepted by its channel).
	if got := readConfigOp(t, s, op.OperationID); got.State != "running" {
		t.Fatalf("while the node applies: %+v; want running", got)
	}
	a.Kill(t)
	// The blocked hook outlives the agent (its own process group); end it
	// without letting it report anything.
	if raw, err := os.ReadFile(filepath.Join(h.dir, "blocked.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && pid > 1 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if got := readConfigOp(t, s, op.OperationID); got.State == "succeeded" || got.State == "failed" {
		t.Fatalf("the operation ended before the agent reported: %+v", got)
	}
	a.Start(t)
	a.WaitLog(t, "session restored from state dir", time.Minute, nil)
	got := awaitConfigOp(t, s, op.OperationID, 2*time.Minute)
	if got.State != "succeeded" {
		t.Fatalf("after the restart: %+v", got)
	}
	requireApplied(t, s, node, 1)
	if n := h.runsOf(t, 1); n < 1 || n > 2 {
		t.Fatalf("hook ran %d times for revision 1, want 1 or 2", n)
	}
	t.Logf("hook ran %d times for revision 1; the restarted agent logged %d interrupted applies resumed", h.runsOf(t, 1),
		len(a.RunLogs("configuration apply was interrupted; applying it once more (hooks must be idempotent)")))
	if doc := onNode(t, a); doc["k"] != float64(1) {
		t.Fatalf("current.json: %v", doc)
	}
}

// TestConfigServerKilledWhileConverging (e): the control plane is killed
// with SIGKILL while the node applies; restarted, the report still arrives
// and the operation succeeds.
func TestConfigServerKilledWhileConverging(t *testing.T) {
	t.Parallel()
	for _, dialect := range dbtest.Dialects(t) {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			s := StartServer(t, serverOptions(t, dialect))
			h := newHook(t)
			_, b, a := enrolledAgent(t, s, "e2e-config-srvkill", AgentOptions{Name: "agent", Args: []string{"--config-hook", h.path}})
			node := b.NodeID
			h.touch(t, "block")
			op := configure(t, s, "cfg-srvkill", node, map[string]any{"k": 2}, false)
			testwait.For(t, "the hook to be running", time.Minute, func() bool {
				_, err := os.Stat(filepath.Join(h.dir, "blocked.pid"))
				return err == nil
			})
			s.Stop(t, syscall.SIGKILL)
			h.touch(t, "release") // the apply ends while the server is down
			a.WaitLog(t, "configuration applied", time.Minute, nil)
			s.Start(t)
			if got := awaitConfigOp(t, s, op.OperationID, 2*time.Minute); got.State != "succeeded" {
				t.Fatalf("after the server restart: %+v", got)
			}
			requireApplied(t, s, node, 1)
			if n := h.runsOf(t, 1); n != 1 {
				t.Fatalf("hook ran %d times, want 1", n)
			}
			// And a change after the restart converges too.
			op = configure(t, s, "cfg-srvkill-2", node, map[string]any{"k": 3}, false)
			if got := awaitConfigOp(t, s, op.OperationID, 2*time.Minute); got.State != "succeeded" {
				t.Fatalf("after the server restart, a change: %+v", got)
			}
			requireApplied(t, s, node, 2)
		})
	}
}

// TestConfigFleetTwentyAgents (f): fleet.configure over 20 real agent
// processes, one of whose hooks fails.
func TestConfigFleetTwentyAgents(t *testing.T) {
	t.Parallel()
	s := StartServer(t, ServerOptions{})
	f := fleetAPI{t: t, s: s}
	const n = 20
	type member struct {
		node string
		a    *Agent
		h    hook
	}
	members := make([]member, n)
	for i := range members {
		b, raw := f.invite(fmt.Sprintf("e2e-fleet-%02d", i), 1)
		h := newHook(t)
		if i == 7 {
			h.write(t, "fail", "node seven refuses\n")
		}
		a := StartAgent(t, AgentOptions{Name: fmt.Sprintf("agent-%02d", i), Bootstrap: raw, Args: []string{"--config-hook", h.path}})
		members[i] = member{node: b.NodeID, a: a, h: h}
	}
	targets := make([]any, n)
	for i, m := range members {
		f.waitNodeState(m.node, "ready", 2*time.Minute)
		targets[i] = map[string]any{"kind": "node", "id": m.node}
	}
	var parent configOp
	s.API(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "cfg-fleet", "kind": "fleet.configure", "targets": targets,
		"operation": map[string]any{"format": "e2e/v1", "document": map[string]any{"fleet": true}, "max_concurrency": 50}}, http.StatusCreated, &parent)
	got := awaitConfigOp(t, s, parent.OperationID, 3*time.Minute)
	if got.State != "failed" || got.Counts == nil || got.Counts.Total != n || got.Counts.Succeeded != n-1 || got.Counts.Failed != 1 {
		b, _ := json.Marshal(got)
		t.Fatalf("parent: %s; want failed with 20 total, 19 succeeded, 1 failed", b)
	}
	for i, m := range members {
		c := readNodeConfig(t, s, m.node)
		want := "applied"
		if i == 7 {
			want = "failed"
			if c.Reported == nil || !strings.Contains(c.Reported.Message, "node seven refuses") {
				t.Errorf("node 7's report: %+v", c.Reported)
			}
		}
		if c.Verdict != want {
			t.Errorf("node %d verdict %s, want %s", i, c.Verdict, want)
		}
		if r := m.h.allRuns(t); r != 1 {
			t.Errorf("node %d's hook ran %d times, want 1", i, r)
		}
	}
}

// TestConfigSealedSecret (g): a sealed value reaches the node's
// current.json and nothing else: no API answer, no log, no database bytes.
func TestConfigSealedSecret(t *testing.T) {
	t.Parallel()
	for _, dialect := range dbtest.Dialects(t) {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			s := StartServer(t, serverOptions(t, dialect))
			h := newHook(t)
			_, b, a := enrolledAgent(t, s, "e2e-config-secret", AgentOptions{Name: "agent", Args: []string{"--config-hook", h.path}})
			node := b.NodeID
			const secret = "e2e-sekrit-Zq81vX-do-not-leak"
			var sealed struct {
				Handle string `json:"handle"`
			}
			s.API(t, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "cfg-secret",
				"target": map[string]any{"kind": "node", "id": node}, "field": "/document/db/password", "value": secret}, http.StatusCreated, &sealed)
			// Watch from before the submit to the end.
			var op configOp
			s.API(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": "cfg-secret", "kind": "node.configure",
				"targets":   []any{map[string]any{"kind": "node", "id": node}},
				"operation": map[string]any{"format": "e2e/v1", "document": map[string]any{"db": map[string]any{"user": "app", "password": sealed.Handle}}}},
				http.StatusCreated, &op)
			watched := watchAll(t, s, op.OperationID)
			if got := awaitConfigOp(t, s, op.OperationID, time.Minute); got.State != "succeeded" {
				t.Fatalf("configure: %+v", got)
			}
			doc := onNode(t, a)
			if db, _ := doc["db"].(map[string]any); db == nil || db["password"] != secret || db["user"] != "app" {
				t.Fatalf("current.json on the node: %v; want the unsealed password", doc)
			}
			answers := map[string][]byte{"watch": <-watched}
			for name, path := range map[string]string{
				"operation":   "/api/v1/operations/" + op.OperationID,
				"node config": "/api/v1/nodes/" + node + "/config",
				"listing":     "/api/v1/node-operations?kind=node.configure",
				"lagging":     "/api/v1/config/lagging",
				"events":      "/api/v1/operations/" + op.OperationID + "/watch",
			} {
				status, raw := s.Call(t, http.MethodGet, path, nil, s.Token)
				if status != http.StatusOK {
					t.Fatalf("GET %s: %d %s", path, status, raw)
				}
				answers[name] = raw
			}
			if !strings.Contains(string(answers["node config"]), `"[sealed]"`) {
				t.Errorf("node config does not mask the sealed value: %s", answers["node config"])
			}
			for name, raw := range answers {
				if bytes.Contains(raw, []byte(secret)) {
					t.Errorf("the secret is in the %s answer: %s", name, raw)
				}
			}
			if strings.Contains(s.Log(), secret) {
				t.Errorf("the secret is in the server's log")
			}
			if strings.Contains(strings.Join(a.Lines(), "\n"), secret) {
				t.Errorf("the secret is in the agent's log")
			}
			if dialect == models.SQLite {
				s.Stop(t, syscall.SIGTERM) // everything checkpointed or in the WAL, both read
				files := 0
				defer func() {
					if files == 0 {
						t.Errorf("no database file read under %s", s.DataDir)
					}
				}()
				_ = filepath.WalkDir(s.DataDir, func(p string, d os.DirEntry, err error) error {
					if err != nil || d.IsDir() {
						return err
					}
					raw, err := os.ReadFile(p)
					if err != nil {
						t.Fatal(err)
					}
					if bytes.Contains(raw, []byte(secret)) {
						t.Errorf("the secret is in %s", p)
					}
					if strings.Contains(filepath.Base(p), ".db") || strings.Contains(filepath.Base(p), "sqlite") {
						files++
					}
					return nil
				})
			} else {
				dump := pgDump(t, s.DatabaseURL)
				if !bytes.Contains(dump, []byte("node_configs")) {
					t.Fatalf("pg_dump did not dump the schema")
				}
				if bytes.Contains(dump, []byte(secret)) {
					t.Errorf("the secret is in pg_dump's output")
				}
			}
		})
	}
}

// watchAll reads the operation's watch stream until it ends.
func watchAll(t *testing.T, s *Server, id string) <-chan []byte {
	t.Helper()
	out := make(chan []byte, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/operations/"+id+"/watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- []byte("watch: " + err.Error())
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out <- raw
	}()
	return out
}

// pgDump dumps the schema of a dbtest.NewSchema URL.
func pgDump(t *testing.T, schemaURL string) []byte {
	t.Helper()
	bin, err := exec.LookPath("pg_dump")
	if err != nil {
		t.Skip("pg_dump not installed")
	}
	u, err := url.Parse(schemaURL)
	if err != nil {
		t.Fatal(err)
	}
	schema := u.Query().Get("search_path")
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	out, err := exec.Command(bin, "--dbname", u.String(), "--schema", schema).Output()
	if err != nil {
		t.Fatalf("pg_dump: %v", err)
	}
	return out
}
