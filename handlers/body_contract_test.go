package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// TestBodyFieldsAsTheContractSays sends the invitation, command, seal,
// package-host, token, retire, cancel and enroll bodies with each field
// at and past the bounds openapi.yaml gives it, and requires the server
// to refuse (400 or 422) exactly the bodies the contract refuses. The
// fuzzers check one direction on random bodies (what the server takes,
// the contract takes); this pins both at the bounds. Time fields are left
// out: their bounds are relative to now.
func TestBodyFieldsAsTheContractSays(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	contract := apitest.ProductContract(t)
	var boot api.Bootstrap
	s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{
		"rental_id": apitest.RandomID("rental-"), "generation": 1}, http.StatusCreated, &boot)

	ids := []any{"", "a", "0", strings.Repeat("a", 128), strings.Repeat("a", 129), ".", "..", ".a", "-a", "a.b:c_d-e", "a/b", "a b", "é", 7}
	n := 0
	fresh := func() map[string]any {
		n++
		return map[string]any{"rental_id": fmt.Sprintf("bounds-%d", n), "generation": 1}
	}
	type variant struct {
		path, field string
		value       any
		body        map[string]any
	}
	var vs []variant
	invite := func(field string, value any, set func(m map[string]any)) {
		m := fresh()
		set(m)
		vs = append(vs, variant{"/api/v1/nodes/invitations", field, value, m})
	}
	for _, v := range []any{0, 0.000001, 0.0000001, 0.25, 100000, 100000.01, 1e9, -1} {
		invite("shadow_price_usd_per_hour", v, func(m map[string]any) { m["shadow_price_usd_per_hour"] = v })
	}
	for _, v := range []any{0, 1, 2, 9007199254740991, -1} {
		invite("generation", v, func(m map[string]any) { m["generation"] = v })
	}
	for _, v := range ids {
		invite("node_id", v, func(m map[string]any) { m["node_id"] = v })
		invite("rental_id", v, func(m map[string]any) { m["rental_id"] = v })
	}
	for _, v := range []any{0, 1, 3600, int64(1) << 40, -5} {
		invite("purchase/billing_interval_seconds", v, func(m map[string]any) {
			m["purchase"] = map[string]any{"billing_interval_seconds": v}
		})
	}
	sixtyFive := make([]string, 65)
	for i := range sixtyFive {
		sixtyFive[i] = fmt.Sprintf("c%d", i)
	}
	for _, v := range [][]string{{}, {""}, {"a"}, {"a", "a"}, {"gpu.a100_x-2"}, {strings.Repeat("c", 64)}, {strings.Repeat("c", 65)},
		{".a"}, {"a b"}, {"a:b"}, {"é"}, sixtyFive[:64], sixtyFive} {
		invite("purchase/eligible_classes", v, func(m map[string]any) { m["purchase"] = map[string]any{"eligible_classes": v} })
	}
	for _, v := range ids {
		vs = append(vs, variant{"/api/v1/nodes/" + boot.NodeID + "/commands", "operation_id", v,
			map[string]any{"kind": api.KindPrepareImage, "operation_id": v, "payload": map[string]any{"image": "registry.example.com/app:v1"}}})
	}
	seal := func(field string, value any, set func(m map[string]any)) {
		n++
		m := map[string]any{"request_id": fmt.Sprintf("seal-%d", n), "target": map[string]any{"kind": "node", "id": boot.NodeID},
			"field": "/env/DB_PASSWORD", "value": "s3cret"}
		set(m)
		vs = append(vs, variant{"/api/v1/secrets/seal", field, value, m})
	}
	for _, v := range []any{"", "r1", strings.Repeat("r", 128), strings.Repeat("r", 129), "a b", ".r"} {
		seal("request_id", v, func(m map[string]any) { m["request_id"] = v })
	}
	for _, v := range []any{"", "/", "/env/A", "env/A", "/a~0b~1c", "/a~2", "/a~", strings.Repeat("/a", 512), "/" + strings.Repeat("a", 1024)} {
		seal("field", v, func(m map[string]any) { m["field"] = v })
	}
	for _, v := range []any{"", "x", strings.Repeat("x", 64<<10), strings.Repeat("x", 64<<10+1)} {
		seal("value", len(v.(string)), func(m map[string]any) { m["value"] = v })
	}
	for _, v := range []any{0, 1, 600, 86400, 86401, -1} {
		seal("ttl_seconds", v, func(m map[string]any) { m["ttl_seconds"] = v })
	}
	for _, v := range []any{"node", "fleet", "endpoint", "package_host", "nodes", ""} {
		seal("target.kind", v, func(m map[string]any) {
			t := map[string]any{"kind": v}
			switch v {
			case "node", "package_host":
				t["id"] = "some-id"
			case "endpoint":
				t["id"] = "https://example.com/health"
			}
			m["target"] = t
		})
	}
	// (A name taken already is 409, not a refusal of its shape.)
	for _, v := range []any{"", "h", " h", "h ", "h h", strings.Repeat("h", 64), strings.Repeat("h", 65), strings.Repeat("é", 64), strings.Repeat("é", 65)} {
		vs = append(vs, variant{"/api/v1/package-hosts", "name", v, map[string]any{"name": v, "families": []string{"nodes"}}})
	}
	for _, v := range []any{"", " ", "t", strings.Repeat("t", 128), strings.Repeat("t", 129), strings.Repeat("é", 128), strings.Repeat("é", 129)} {
		vs = append(vs, variant{"/api/v1/tokens", "name", v, map[string]any{"name": v}})
	}

	for _, v := range []any{"", "r", strings.Repeat("r", 512), strings.Repeat("r", 513), 7} {
		var b api.Bootstrap
		s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", fresh(), http.StatusCreated, &b)
		vs = append(vs, variant{"/api/v1/nodes/" + b.NodeID + "/retire", "reason", v, map[string]any{"reason": v}})
	}
	for _, v := range []any{"", "r", strings.Repeat("r", 1024), strings.Repeat("r", 1025), 7} {
		n++
		var op struct {
			ID string `json:"operation_id"`
		}
		s.Admin(t, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": fmt.Sprintf("cancel-%d", n), "kind": "node.configure",
			"targets":   []any{map[string]any{"kind": "node", "id": boot.NodeID}},
			"operation": map[string]any{"format": "bounds/v1", "document": map[string]any{"n": n}}}, http.StatusCreated, &op)
		vs = append(vs, variant{"/api/v1/operations/" + op.ID + "/cancel", "reason", v, map[string]any{"reason": v}})
	}
	enroll := func(field string, value any) {
		var b api.Bootstrap
		s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", fresh(), http.StatusCreated, &b)
		m := map[string]any{"node_id": b.NodeID, "generation": 1, "enrollment_token": b.EnrollmentToken, "agent_version": "0.0.0-test",
			"facts": agentFacts()}
		m[field] = value
		vs = append(vs, variant{"/agent/v1/enroll", field, value, m})
	}
	for _, v := range []any{"", strings.Repeat("n", 21), strings.Repeat("n", 22), strings.Repeat("n", 128), strings.Repeat("n", 129), "a+b/c=" + strings.Repeat("n", 20)} {
		enroll("enrollment_nonce", v)
	}
	for _, v := range []any{"", "0.0.0-test"} {
		enroll("agent_version", v)
	}

	for _, v := range vs {
		body, err := json.Marshal(v.body)
		require.NoError(t, err)
		refusal := contract.CheckRequest(s.NewRequest(t, http.MethodPost, v.path, apitest.Raw(string(body)), s.AdminToken))
		status, _, raw := s.Do(t, http.MethodPost, v.path, apitest.Raw(string(body)), s.AdminToken)
		refused := status == http.StatusBadRequest || status == http.StatusUnprocessableEntity
		switch {
		case refusal != nil && !refused:
			t.Errorf("POST %s %s=%v: the contract refuses it (%v), the server answered %d", v.path, v.field, v.value, refusal, status)
		case refusal == nil && refused:
			t.Errorf("POST %s %s=%v: the contract accepts it, the server refused it: %s", v.path, v.field, v.value, raw)
		}
	}
}
