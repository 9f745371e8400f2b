package handlers_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
)

// The admin API's and the agent results door's JSON decoders each get a
// fuzz target: whatever the body, the answer is never a 5xx and every
// refusal is a problem document (checkFuzzAnswer). FuzzDecodeJSON covers
// the shared decoder; these cover each endpoint's own validation after it.

// adminFuzzServer is a server with one ready node, answering the node's id.
func adminFuzzServer(f *testing.F) (*apitest.Server, string, string) {
	s := apitest.Start(f)
	var boot api.Bootstrap
	s.Admin(f, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": "fuzz-admin", "generation": 1}, http.StatusCreated, &boot)
	var resp api.EnrollResponse
	s.JSON(f, "POST", "/agent/v1/enroll", api.EnrollRequest{NodeID: boot.NodeID, Generation: 1, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "x", Facts: agentFacts()}, "", http.StatusOK, &resp)
	return s, boot.NodeID, resp.SessionToken
}

func FuzzResultsDecode(f *testing.F) {
	s, _, tok := adminFuzzServer(f)
	f.Add([]byte(`{"results":[{"operation_id":"a","applied":true}]}`))
	f.Add([]byte(`{"results":[{"operation_id":"","applied":false,"failure":"x","duplicate":true}]}`))
	f.Add([]byte(`{"results":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/agent/v1/results", tok, body))
	})
}

func FuzzInviteDecode(f *testing.F) {
	s, _, _ := adminFuzzServer(f)
	f.Add([]byte(`{"rental_id":"r","generation":1}`))
	f.Add([]byte(`{"rental_id":"r","generation":2,"shadow_price_usd_per_hour":1e308,"redeemable_through":"2026-01-01T00:00:00Z","purchase":{"billing_interval_seconds":0,"eligible_classes":["a"]},"labels":{"k":"v"}}`))
	f.Add([]byte(`{"node_id":"../x","rental_id":"\u0000","generation":-1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/nodes/invitations", s.AdminToken, body))
	})
}

func FuzzReinviteDecode(f *testing.F) {
	s, node, _ := adminFuzzServer(f)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"redeemable_through":"2099-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/nodes/"+node+"/reinvite", s.AdminToken, body))
	})
}

func FuzzCommandDecode(f *testing.F) {
	s, node, _ := adminFuzzServer(f)
	f.Add([]byte(`{"kind":"launch_workload","operation_id":"op-1","payload":{"run_id":"r","attempt_id":"a","command":"sh","args":["-c","true"],"env":{"A":"b"}}}`))
	f.Add([]byte(`{"kind":"stop_workload","operation_id":"op-2","payload":{"run_id":"r","attempt_id":"a","grace_seconds":-5}}`))
	f.Add([]byte(`{"kind":"prepare_artifact","operation_id":"op-3","payload":{"artifact_id":"a","url":"file:///etc/passwd","sha256":"zz"}}`))
	f.Add([]byte(`{"kind":"prepare_image","operation_id":"op-4","payload":{"name":"x","artifact_id":"a"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/nodes/"+node+"/commands", s.AdminToken, body))
	})
}

func FuzzSubmitDecode(f *testing.F) {
	s, node, _ := adminFuzzServer(f)
	f.Add([]byte(`{"request_id":"r1","kind":"node.stop_workload","targets":[{"kind":"node","id":"` + node + `"}],"operation":{"run_id":"r","attempt_id":"a","grace_seconds":1}}`))
	f.Add([]byte(`{"request_id":"r2","kind":"fleet.command","targets":[{"kind":"fleet"}],"operation":{"kind":"node.stop_workload","selector":{}},"wait_timeout_ms":1}`))
	f.Add([]byte(`{"request_id":"r3","kind":"node.invite","targets":[{"kind":"node"}],"operation":{"rental_id":"x","generation":1}}`))
	f.Add([]byte(`{"request_id":"r4","kind":"credential.issue","targets":[],"operation":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/operations", s.AdminToken, body))
	})
}

func FuzzSealDecode(f *testing.F) {
	s, node, _ := adminFuzzServer(f)
	f.Add([]byte(`{"value":"hunter2","target":{"kind":"node","id":"` + node + `"},"ttl_seconds":60}`))
	f.Add([]byte(`{"value":"","target":{"kind":"fleet"},"ttl_seconds":999999999}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/secrets/seal", s.AdminToken, body))
	})
}

func FuzzPackageHostDecode(f *testing.F) {
	s, _, _ := adminFuzzServer(f)
	f.Add([]byte(`{"name":"ph","families":["commands","nodes"]}`))
	f.Add([]byte(`{"name":"","families":["credentials"]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/package-hosts", s.AdminToken, body))
	})
}

func FuzzTokenDecode(f *testing.F) {
	s, _, _ := adminFuzzServer(f)
	f.Add([]byte(`{"name":"ci"}`))
	f.Add([]byte(`{"name":"\u202e"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFuzzAnswer(t, fuzzPost(s, "/api/v1/tokens", s.AdminToken, body))
	})
}

// FuzzListingQueries sends fuzzed query strings to every listing and
// long-poll endpoint that parses one (filters, limit, cursors, wait): never
// a 5xx, every refusal a problem document.
func FuzzListingQueries(f *testing.F) {
	s, node, tok := adminFuzzServer(f)
	for _, q := range []string{"limit=5", "limit=0", "limit=501", "before=MTIzfGlk", "before=-1", "state=running&kind=node.invite",
		"node_id=x&package_host_id=y&package_host_generation=2", "wait=60", "wait=1e9", "since=2026-01-01T00:00:00Z", "%zz", "limit=5;x", "class=a&class=b"} {
		for i := range 9 {
			f.Add(q, uint8(i))
		}
	}
	paths := []string{"/api/v1/operations", "/api/v1/nodes", "/api/v1/node-operations", "/api/v1/nodes/" + node + "/commands",
		"/api/v1/nodes/" + node + "/audit", "/api/v1/nodes/" + node + "/timeline", "/api/v1/package-hosts", "/api/v1/admin-audit", "/api/v1/secret-audit"}
	f.Fuzz(func(t *testing.T, raw string, which uint8) {
		if strings.ContainsAny(raw, "#\x00\r\n ") {
			return // not a query string a client can send
		}
		path, token := "", s.AdminToken
		if int(which) < len(paths) {
			path = paths[which]
		} else {
			path, token = "/agent/v1/commands", tok
			raw = "wait=0&" + raw // never hold the fuzzer on a long-poll
		}
		req := httptest.NewRequest(http.MethodGet, "/x", nil)
		req.URL.Path, req.URL.RawQuery = path, raw
		req.RequestURI = ""
		req.Header.Set("Authorization", "Bearer "+token)
		checkFuzzAnswer(t, fuzzServe(s, req, nil))
	})
}
