package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
)

// TestAgentBodiesAsTheContractSays is TestBodyFieldsAsTheContractSays for
// the agent's doors: events (heartbeat facts, workload observations,
// configuration reports), results and output, each field at and past the
// bounds openapi.yaml gives it. The server must refuse (400 or 422)
// exactly what the contract refuses: an agent built from the contract
// must never have a spool the server will not take.
func TestAgentBodiesAsTheContractSays(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	contract := apitest.ProductContract(t)
	_, sess := inviteAndEnroll(t, s)
	now := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)

	ids := []any{"", "a", strings.Repeat("a", 128), strings.Repeat("a", 129), ".a", "-a", "a.b:c_d-e", "../a", "a b", "é", 7}
	names := []any{"", "h", strings.Repeat("h", 256), strings.Repeat("h", 257), "h\x01", "h\u202e", "é"}
	type variant struct {
		path, field string
		value       any
		body        map[string]any
		// inWords: a rule openapi.yaml states in a description only (the
		// Conventions' characters, which member an event kind carries, an
		// exit code only with exited); the server must refuse it.
		inWords bool
	}
	var vs []variant
	n := 0
	event := func(field string, value any, e map[string]any) {
		n++
		e["id"] = fmt.Sprintf("ev-%d", n)
		if _, ok := e["observed_at"]; !ok {
			e["observed_at"] = now
		}
		vs = append(vs, variant{path: "/agent/v1/events", field: field, value: value, body: map[string]any{"events": []any{e}}})
	}
	facts := func(field string, value any) {
		f := map[string]any{"hostname": "h", "os": "linux", "arch": "amd64", "cpus": 2, "memory_bytes": 1 << 30,
			"agent_version": "0.0.0-test", "runtimes": []string{"process"}, "observed_at": now}
		setField(f, field, value)
		event("facts."+field, value, map[string]any{"kind": "heartbeat", "facts": f})
	}
	for _, v := range names {
		for _, f := range []string{"hostname", "os", "arch", "agent_version"} {
			facts(f, v)
			if s, ok := v.(string); ok && strings.ContainsAny(s, "\x01\u202e") {
				vs[len(vs)-1].inWords = true
			}
		}
	}
	for _, f := range []string{"hostname", "os", "arch", "cpus", "memory_bytes", "agent_version", "runtimes", "observed_at", "disk_free_bytes", "labels", "capabilities"} {
		facts(f, "-")
	}
	for _, v := range []any{-1, 0, 1, 1 << 20} {
		facts("cpus", v)
	}
	for _, v := range []any{-1, 0, int64(1) << 50} {
		facts("memory_bytes", v)
		facts("disk_free_bytes", v)
	}
	for _, v := range []any{[]string{}, nil, []string{""}, []string{"process"}, []string{strings.Repeat("r", 65)}} {
		facts("runtimes", v)
	}
	for _, v := range []any{map[string]any{}, map[string]any{"role": "web"}, map[string]any{"": "x"}, map[string]any{"role": ""},
		map[string]any{"role": strings.Repeat("v", 257)}} {
		facts("labels", v)
	}
	for _, v := range []any{map[string]any{"r\u202e": "x"}, map[string]any{"r": "\x01"}} {
		facts("labels", v)
		vs[len(vs)-1].inWords = true
	}
	for _, v := range []any{[]string{}, []string{"diag.v1"}, []string{"Diag.v1"}, []string{"diag"}, []string{"diag.v1", "diag.v1"}} {
		facts("capabilities", v)
	}

	workload := func(field string, value any) {
		w := map[string]any{"run_id": "run-1", "attempt_id": "a1", "state": "exited", "exit_code": 0, "observed_at": now}
		setField(w, field, value)
		event("workload."+field, value, map[string]any{"kind": "workload", "workload": w})
	}
	for _, v := range ids {
		workload("run_id", v)
		workload("attempt_id", v)
	}
	for _, v := range []any{"exited", "absent", "lost", ""} {
		workload("state", v)
	}
	for _, v := range []any{-1, 255, 1 << 31} {
		workload("exit_code", v)
	}
	for _, v := range []any{nil, "-"} {
		workload("exit_code", v)
		vs[len(vs)-1].inWords = true
	}

	config := func(field string, value any) {
		c := map[string]any{"revision": 1, "hash": strings.Repeat("a", 64), "state": "applied", "message": ""}
		setField(c, field, value)
		event("config."+field, value, map[string]any{"kind": "config", "config": c})
	}
	for _, v := range []any{-1, 0, 1, int64(1) << 60, "-"} {
		config("revision", v)
	}
	config("hash", "-")
	config("state", "-")
	for _, v := range []any{"", "abc", strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("A", 64)} {
		config("hash", v)
	}
	for _, v := range []any{"applied", "failed", "stale", ""} {
		config("state", v)
	}
	for _, v := range []any{"", strings.Repeat("m", 5000), "-"} {
		config("message", v)
	}
	for _, v := range []any{"", "e", strings.Repeat("e", 128), strings.Repeat("e", 129), "a b"} {
		vs = append(vs, variant{path: "/agent/v1/events", field: "id", value: v, body: map[string]any{"events": []any{map[string]any{
			"id": v, "kind": "workload", "observed_at": now,
			"workload": map[string]any{"run_id": "r", "attempt_id": "a", "state": "running", "observed_at": now}}}}})
	}
	for _, v := range []any{"heartbeat", "workload", "config", "exit", ""} {
		vs = append(vs, variant{path: "/agent/v1/events", field: "kind", value: v, body: map[string]any{"events": []any{map[string]any{
			"id": fmt.Sprintf("k-%v", v), "kind": v, "observed_at": now}}}, inWords: v == "workload" || v == "config"})
	}

	for _, v := range ids {
		vs = append(vs, variant{path: "/agent/v1/results", field: "operation_id", value: v, body: map[string]any{"results": []any{map[string]any{
			"operation_id": v, "applied": true}}}})
	}
	for _, f := range []string{"operation_id", "applied", "duplicate"} {
		r := map[string]any{"operation_id": "op-1", "applied": true, "duplicate": false}
		setField(r, f, "-")
		vs = append(vs, variant{path: "/agent/v1/results", field: f, value: "-", body: map[string]any{"results": []any{r}}})
	}
	for _, v := range []any{"", "boom", strings.Repeat("f", 5000)} {
		vs = append(vs, variant{path: "/agent/v1/results", field: "failure", value: v, body: map[string]any{"results": []any{map[string]any{
			"operation_id": "op-1", "applied": false, "failure": v}}}})
	}

	output := func(field string, value any) {
		n++
		o := map[string]any{"run_id": "run-1", "attempt_id": fmt.Sprintf("a%d", n), "stdout_tail": "out", "stderr_tail": "", "truncated": false}
		setField(o, field, value)
		vs = append(vs, variant{path: "/agent/v1/output", field: field, value: value, body: o})
	}
	for _, v := range ids {
		output("run_id", v)
	}
	for _, v := range []any{"", strings.Repeat("o", 65536), strings.Repeat("o", 65537), "-"} {
		output("stdout_tail", v)
	}
	for _, f := range []string{"run_id", "attempt_id", "stderr_tail", "truncated"} {
		output(f, "-")
	}

	for _, v := range vs {
		raw, err := json.Marshal(v.body)
		require.NoError(t, err)
		refusal := contract.CheckRequest(s.NewRequest(t, http.MethodPost, v.path, apitest.Raw(string(raw)), sess.SessionToken))
		if v.inWords {
			refusal = fmt.Errorf("its description refuses it")
		}
		status, _, answer := s.Do(t, http.MethodPost, v.path, apitest.Raw(string(raw)), sess.SessionToken)
		refused := status == http.StatusBadRequest || status == http.StatusUnprocessableEntity
		what := fmt.Sprintf("POST %s %s=%.40v", v.path, v.field, v.value)
		switch {
		case refusal != nil && !refused:
			t.Errorf("%s: the contract refuses it (%.300v), the server answered %d", what, refusal, status)
		case refusal == nil && refused:
			t.Errorf("%s: the contract accepts it, the server refused it: %.300s", what, answer)
		}
	}
}

// setField sets m[field] to value, or deletes it when value is "-".
func setField(m map[string]any, field string, value any) {
	if value == "-" {
		delete(m, field)
		return
	}
	m[field] = value
}
