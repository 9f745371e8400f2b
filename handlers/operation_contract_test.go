package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// TestOperationBodiesAsTheContractSays does for each kind's operation what
// TestBodyFieldsAsTheContractSays does for the fixed bodies: every field
// at and past the bounds openapi.yaml gives it, and the server must refuse
// (400 or 422) exactly what the contract refuses. A submit body carries
// its operation under an anyOf of every kind's schema, which alone would
// let one kind's body pass for another's, so each variant is also checked
// against its own kind's schema. Command payloads go through both doors
// (the ledger's submit and the node's commands wrapper). Bounds the
// contract states only in words (a document's 256 KiB, which parameters
// each diagnose action takes) are TestHostileRequests' business.
func TestOperationBodiesAsTheContractSays(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	contract := apitest.ProductContract(t)
	facts := agentFacts()
	facts.Capabilities = []string{"commands.v1", "config.v1", "output.v1", "diag.v1"}
	// Accepted operations stay open (no agent answers them), and a node
	// holds at most 32 (the per-node quota): each node takes 30, then
	// the next one is enrolled.
	node, onNode := "", 0
	nodeFor := func() string {
		if node == "" || onNode == 30 {
			node, onNode = enrollWith(t, s, facts).NodeID, 0
		}
		return node
	}

	ids := []any{"", "a", strings.Repeat("a", 128), strings.Repeat("a", 129), ".a", "-a", "a.b:c_d-e", "../a", "a/b", "a b", "é", 7}
	hex64 := strings.Repeat("ab", 32)
	type variant struct {
		kind, schema, field string
		value               any
		operation           map[string]any
		top                 map[string]any // top-level fields other than the operation
		// inWords: a bound openapi.yaml states only in a description
		// (OpenAPI 3.0 cannot constrain a map's keys); the server must
		// refuse it.
		inWords bool
	}
	var vs []variant
	n := 0
	// vary adds one variant of kind's base operation with field set to
	// value (a path of keys into the operation; "-" deletes it).
	vary := func(kind, schema string, base func() map[string]any, field string, value any) {
		op := base()
		keys := strings.Split(field, ".")
		m := op
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		setField(m, keys[len(keys)-1], value)
		vs = append(vs, variant{kind: kind, schema: schema, field: field, value: value, operation: op})
	}

	image := func() map[string]any { return map[string]any{"image": "registry.example.com/app:v1"} }
	for _, v := range []any{"", "a", strings.Repeat("i", 512), strings.Repeat("i", 513), 7} {
		vary(api.KindPrepareImage, "PrepareImagePayload", image, "image", v)
	}
	for _, v := range ids {
		vary(api.KindPrepareImage, "PrepareImagePayload", image, "artifact_id", v)
	}
	vary(api.KindPrepareImage, "PrepareImagePayload", image, "unknown", "x")

	artifact := func() map[string]any {
		return map[string]any{"artifact_id": "app-v1", "url": "https://artifacts.example.com/app.tar.gz", "sha256": hex64}
	}
	for _, v := range ids {
		vary(api.KindPrepareArtifact, "PrepareArtifactPayload", artifact, "artifact_id", v)
	}
	for _, v := range []any{"", "https://a.example/x", "http://a.example/x", "ftp://a.example/x", "a.example/x", "-"} {
		vary(api.KindPrepareArtifact, "PrepareArtifactPayload", artifact, "url", v)
	}
	for _, v := range []any{hex64, strings.ToUpper(hex64), hex64[:63], hex64 + "a", "sha256:" + hex64, strings.Repeat("g", 64), "-"} {
		vary(api.KindPrepareArtifact, "PrepareArtifactPayload", artifact, "sha256", v)
	}
	vary(api.KindPrepareArtifact, "PrepareArtifactPayload", artifact, "unknown", "x")

	launch := func() map[string]any {
		return map[string]any{"run_id": "run-1", "attempt_id": "a1", "command": "sleep", "args": []string{"1"}}
	}
	for _, v := range ids {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "run_id", v)
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "attempt_id", v)
	}
	for _, v := range []any{"", "sleep", "/bin/sleep", "-"} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "command", v)
	}
	for _, v := range []any{[]string{}, []string{""}, []string{"a\x00b"}, []any{1}} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "args", v)
	}
	for _, v := range []any{map[string]any{}, map[string]any{"A": ""}, map[string]any{"A_1": "v"},
		map[string]any{"A\x00": "v"}, map[string]any{"A": "v\x00"}, map[string]any{"A": 1}} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "env", v)
	}
	for _, v := range []any{map[string]any{"": "v"}, map[string]any{"A=B": "v"}} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "env", v)
		vs[len(vs)-1].inWords = true
	}
	for _, v := range []any{"", "app:v1", "a b", strings.Repeat("i", 512), strings.Repeat("i", 513)} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "image", v)
	}
	for _, v := range []any{[]string{}, []string{"cache"}, []string{""}, []string{"../x"}, []string{strings.Repeat("c", 129)}} {
		vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "cache_volumes", v)
	}
	vary(api.KindLaunchWorkload, "LaunchWorkloadPayload", launch, "unknown", "x")

	stop := func() map[string]any {
		return map[string]any{"run_id": "run-1", "attempt_id": "a1", "grace_seconds": 5}
	}
	for _, v := range []any{-1, 0, 3600, 3601, 1.5, "-"} {
		vary(api.KindStopWorkload, "StopWorkloadPayload", stop, "grace_seconds", v)
	}
	for _, v := range ids {
		vary(api.KindStopWorkload, "StopWorkloadPayload", stop, "run_id", v)
	}
	vary(api.KindStopWorkload, "StopWorkloadPayload", stop, "unknown", "x")

	retire := func() map[string]any { return map[string]any{} }
	for _, v := range []any{"", "r", strings.Repeat("r", 512), strings.Repeat("r", 513)} {
		vary("node.retire", "NodeRetireOperation", retire, "reason", v)
	}

	configure := func() map[string]any { return map[string]any{"format": "site/v1", "document": map[string]any{"a": 1}} }
	for _, v := range []any{"", "a", "nginx.site/v1", "a b", "é", strings.Repeat("f", 128), strings.Repeat("f", 129), "-"} {
		vary("node.configure", "NodeConfigureOperation", configure, "format", v)
	}
	for _, v := range []any{nil, "text", 1, []any{}, "-"} {
		vary("node.configure", "NodeConfigureOperation", configure, "document", v)
	}
	for _, v := range []any{true, false, "yes", nil} {
		vary("node.configure", "NodeConfigureOperation", configure, "force", v)
	}

	diagnose := func() map[string]any { return map[string]any{"action": "connect", "host": "db.internal", "port": 5432} }
	for _, v := range []any{"disk", "clock", "shell", "", "-"} {
		vary("node.diagnose", "NodeDiagnoseOperation", func() map[string]any { return map[string]any{} }, "action", v)
	}
	for _, v := range []any{0, 1, 65535, 65536, -1, 1.5} {
		vary("node.diagnose", "NodeDiagnoseOperation", diagnose, "port", v)
	}
	for _, v := range []any{0, 0.5, 10, 10.5, -1} {
		vary("node.diagnose", "NodeDiagnoseOperation", diagnose, "timeout_seconds", v)
	}
	for _, v := range []any{"", "db", "10.0.0.1", strings.Repeat("h", 63), strings.Repeat("h", 64), "-h", "h-", "h-h.example.", "::1", "fe80::1", strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127), "a b", "-"} {
		vary("node.diagnose", "NodeDiagnoseOperation", diagnose, "host", v)
	}
	disk := func() map[string]any { return map[string]any{"action": "disk"} }
	nine := []string{"/1", "/2", "/3", "/4", "/5", "/6", "/7", "/8", "/9"}
	for _, v := range []any{[]string{}, []string{"/"}, []string{"var"}, []string{""}, nine[:8], nine, []string{"/" + strings.Repeat("p", 4095)}, []string{"/" + strings.Repeat("p", 4096)}} {
		vary("node.diagnose", "NodeDiagnoseOperation", disk, "paths", v)
	}
	resolve := func() map[string]any { return map[string]any{"action": "resolve", "names": []string{"example.com"}} }
	eleven := []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11"}
	for _, v := range []any{[]string{}, eleven[:10], eleven, []string{""}, []string{strings.Repeat("a.", 126) + "a"}, []string{strings.Repeat("a.", 127)}} {
		vary("node.diagnose", "NodeDiagnoseOperation", resolve, "names", v)
	}

	hostOp := func() map[string]any { return map[string]any{"name": "h", "families": []string{"nodes"}} }
	n++
	for _, v := range []any{"", "h", " h", "h ", "h h", strings.Repeat("h", 64), strings.Repeat("h", 65), strings.Repeat("é", 64), strings.Repeat("é", 65)} {
		vary("credential.issue", "CredentialIssueOperation", hostOp, "name", v)
	}
	for _, v := range []any{[]string{}, []string{"nodes", "nodes"}, []string{"credentials"}, []string{"x"}, []string{"nodes", "commands", "fleet", "nodeconfig", "diagnose"}} {
		vary("credential.issue", "CredentialIssueOperation", hostOp, "families", v)
	}

	fleetCmd := func() map[string]any {
		return map[string]any{"kind": "node." + api.KindPrepareImage, "payload": image(), "selector": map[string]any{"labels": map[string]any{"role": "web"}}}
	}
	for _, v := range []any{-1, 0, 1, 10000, 10001} {
		vary("fleet.command", "FleetCommandOperation", fleetCmd, "max_concurrency", v)
	}
	for _, v := range []any{"ready", "lost", "retired", "enrolling", "gone", ""} {
		vary("fleet.command", "FleetCommandOperation", fleetCmd, "selector.state", v)
	}
	for _, v := range []any{"", "gpu", "a b"} {
		vary("fleet.command", "FleetCommandOperation", fleetCmd, "selector.class", v)
	}
	for _, v := range []any{"node." + api.KindPrepareImage, api.KindPrepareImage, "node.retire", "node.diagnose", ""} {
		vary("fleet.command", "FleetCommandOperation", fleetCmd, "kind", v)
	}
	vary("fleet.command", "FleetCommandOperation", fleetCmd, "selector.unknown", "x")

	// Top-level fields, on a retire (the quickest kind to accept).
	for _, v := range []any{-1, 0, 60000, 60001} {
		vs = append(vs, variant{kind: "node.retire", schema: "NodeRetireOperation", field: "wait_timeout_ms", value: v,
			operation: map[string]any{}, top: map[string]any{"wait_timeout_ms": v}})
	}
	for _, v := range []any{"", "r", strings.Repeat("r", 1024), strings.Repeat("r", 1025)} {
		vs = append(vs, variant{kind: "node.retire", schema: "NodeRetireOperation", field: "reason", value: v,
			operation: map[string]any{}, top: map[string]any{"reason": v}})
	}

	targetsOf := func(kind string) []map[string]any {
		switch {
		case kind == "credential.issue":
			return nil
		case kind == "node.retire":
			// Each retire its own node, so every accepted one is a fresh
			// retirement, not the replay of another.
			var boot api.Bootstrap
			s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{
				"rental_id": apitest.RandomID("retire-"), "generation": 1}, http.StatusCreated, &boot)
			return []map[string]any{{"kind": "node", "id": boot.NodeID}}
		case strings.HasPrefix(kind, "fleet."):
			return []map[string]any{{"kind": "fleet"}}
		default:
			return []map[string]any{{"kind": "node", "id": nodeFor()}}
		}
	}
	check := func(path string, body map[string]any, schema string, value any, inWords bool, what string) {
		t.Helper()
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		refusal := contract.CheckRequest(s.NewRequest(t, http.MethodPost, path, apitest.Raw(string(raw)), s.AdminToken))
		switch {
		case inWords:
			refusal = fmt.Errorf("its description refuses it")
		case strings.Contains(string(raw), `\u0000`):
			// openapi.yaml's Conventions: text holding U+0000 is 422.
			refusal = fmt.Errorf("the conventions refuse U+0000")
		}
		if schema != "" {
			if err := contract.CheckValue(schema, value); err != nil {
				refusal = err
			}
		}
		status, _, answer := s.Do(t, http.MethodPost, path, apitest.Raw(string(raw)), s.AdminToken)
		if status < 300 {
			onNode++
		}
		refused := status == http.StatusBadRequest || status == http.StatusUnprocessableEntity
		switch {
		case refusal != nil && !refused:
			t.Errorf("%s: the contract refuses it (%v), the server answered %d: %s", what, refusal, status, answer)
		case refusal == nil && refused:
			t.Errorf("%s: the contract accepts it, the server refused it: %s", what, answer)
		}
	}
	for _, v := range vs {
		n++
		kind := v.kind
		if strings.HasSuffix(v.schema, "Payload") {
			kind = "node." + v.kind
		}
		body := map[string]any{"request_id": fmt.Sprintf("bounds-%d", n), "kind": kind, "operation": v.operation}
		if targets := targetsOf(v.kind); targets != nil {
			body["targets"] = targets
		}
		for k, x := range v.top {
			body[k] = x
		}
		check("/api/v1/operations", body, v.schema, v.operation, v.inWords, fmt.Sprintf("submit %s %s=%v", kind, v.field, v.value))
		if strings.HasSuffix(v.schema, "Payload") {
			n++
			body := map[string]any{"kind": v.kind, "operation_id": fmt.Sprintf("bounds-%d", n), "payload": v.operation}
			check("/api/v1/nodes/"+nodeFor()+"/commands", body, v.schema, v.operation, v.inWords, fmt.Sprintf("command %s %s=%v", v.kind, v.field, v.value))
		}
	}
}

// TestFieldPathsPointIntoTheBody: every validation_failed field is one
// style, a path into the body the caller sent with its segments joined by
// "/" (a JSON pointer without its leading "/"), whichever door the same
// check is reached through.
func TestFieldPathsPointIntoTheBody(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	boot, sess := inviteAndEnroll(t, s)
	node := []any{map[string]any{"kind": "node", "id": boot.NodeID}}
	for _, c := range []struct {
		name, method, path, token string
		body                      any
		field                     string
	}{
		{"LedgerCommand", http.MethodPost, "/api/v1/operations", s.AdminToken, map[string]any{"request_id": "fp-1",
			"kind": "node.prepare_image", "targets": node, "operation": map[string]any{"image": "has space"}}, "operation/image"},
		{"WrapperCommand", http.MethodPost, "/api/v1/nodes/" + boot.NodeID + "/commands", s.AdminToken, map[string]any{
			"kind": "prepare_image", "operation_id": "fp-2", "payload": map[string]any{"image": "has space"}}, "payload/image"},
		{"FanOutCommand", http.MethodPost, "/api/v1/operations", s.AdminToken, map[string]any{"request_id": "fp-3",
			"kind": "fleet.command", "targets": node, "operation": map[string]any{"kind": "node.prepare_image",
				"payload": map[string]any{"image": "has space"}}}, "operation/payload/image"},
		{"LedgerInvite", http.MethodPost, "/api/v1/operations", s.AdminToken, map[string]any{"request_id": "fp-4",
			"kind": "node.invite", "operation": map[string]any{"rental_id": "fp-4", "generation": 1,
				"purchase": map[string]any{"billing_interval_seconds": 0}}}, "operation/purchase/billing_interval_seconds"},
		{"LedgerInviteNoRental", http.MethodPost, "/api/v1/operations", s.AdminToken, map[string]any{"request_id": "fp-5",
			"kind": "node.invite", "operation": map[string]any{"generation": 1}}, "operation/rental_id"},
		{"WrapperInvite", http.MethodPost, "/api/v1/nodes/invitations", s.AdminToken, map[string]any{"rental_id": "fp-6", "generation": 1,
			"purchase": map[string]any{"billing_interval_seconds": 0}}, "purchase/billing_interval_seconds"},
		{"WrapperInviteClass", http.MethodPost, "/api/v1/nodes/invitations", s.AdminToken, map[string]any{"rental_id": "fp-7", "generation": 1,
			"purchase": map[string]any{"eligible_classes": []any{"ok", nil}}}, "purchase/eligible_classes/1"},
		{"AgentFacts", http.MethodPost, "/agent/v1/events", sess.SessionToken, map[string]any{"events": []any{
			map[string]any{"id": "fp-8", "kind": "heartbeat", "observed_at": time.Now().UTC(), "facts": map[string]any{
				"hostname": "h", "os": "linux", "arch": "amd64", "cpus": -1, "memory_bytes": 1, "agent_version": "x",
				"runtimes": []string{}, "observed_at": time.Now().UTC()}}}}, "events/0/facts/cpus"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := s.Problem(t, c.method, c.path, c.body, c.token, http.StatusUnprocessableEntity, "validation_failed")
			require.NotEmpty(t, p.Errors, "%s", p.Raw)
			require.Equal(t, c.field, p.Errors[0].Field, "%s", p.Raw)
			require.True(t, strings.HasPrefix(p.Detail, c.field+": "), "the detail names the same path: %s", p.Detail)
		})
	}
}
