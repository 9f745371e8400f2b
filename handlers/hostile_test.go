package handlers_test

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/internal/tally"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// allRowCounts is rowCounts widened to the fleet's tables and console
// sessions: what a refused request must leave unchanged.
func allRowCounts(t *testing.T, s *apitest.Server) []int64 {
	t.Helper()
	c := rowCounts(t, s)
	out := c[:]
	for _, m := range []any{&models.ConsoleSession{}, &models.Node{}, &models.Invitation{}, &models.NodeEvent{},
		&models.Workload{}, &models.NodeAudit{}, &models.Command{}} {
		out = append(out, dbtest.Count(t, s.App.DB.DB, m))
	}
	return out
}

var csrfField = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// consoleSignIn signs the administrator in and answers the session cookie
// and the session's CSRF token.
func consoleSignIn(t *testing.T, s *apitest.Server) (cookie, csrf string) {
	t.Helper()
	form := url.Values{"username": {apitest.AdminUsername}, "password": {apitest.AdminPassword}}
	resp, err := s.Client.Do(s.NewRequest(t, http.MethodPost, "/console/login",
		apitest.Body{ContentType: "application/x-www-form-urlencoded", Data: []byte(form.Encode())}, ""))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for _, c := range resp.Cookies() {
		if c.Name == "nodeward_session" {
			cookie = c.Value
		}
	}
	require.NotEmpty(t, cookie)
	req := s.NewRequest(t, http.MethodGet, "/console/tokens", nil, "")
	req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
	status, _, raw := s.Send(t, req)
	require.Equal(t, http.StatusOK, status)
	m := csrfField.FindSubmatch(raw)
	require.NotNil(t, m, "no CSRF field")
	return cookie, string(m[1])
}

// hostile is one request an unfriendly or broken client sends.
type hostile struct {
	name   string
	method string
	path   string
	body   any    // nil, apitest.Body, or url.Values (a console form)
	as     string // "": nobody; "admin"; "agent"; "console"; "Name: value", that header; else an Authorization header
	status int
	code   string // the problem code; "" for a console page or a file
}

func rawJSON(s string) apitest.Body { return apitest.Raw(s) }

// TestHostileRequests sends requests that are malformed, oversized,
// mis-named, mis-encoded or sent without credentials, to the API, the agent
// API and the console: each gets its documented refusal, never a 5xx, and
// changes no row.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		boot, enrolled := inviteAndEnroll(t, s)
		node := "/api/v1/nodes/" + boot.NodeID
		cookie, csrf := consoleSignIn(t, s)
		form := func(kv ...string) url.Values {
			v := url.Values{"csrf_token": {csrf}}
			for i := 0; i+1 < len(kv); i += 2 {
				v.Set(kv[i], kv[i+1])
			}
			return v
		}
		facts := `{"hostname":"h","os":"linux","arch":"amd64","cpus":1,"memory_bytes":1,"agent_version":"v","runtimes":["process"],"observed_at":"2026-01-01T00:00:00Z"}`
		heartbeat := func(facts string) apitest.Body {
			return rawJSON(`{"events":[{"id":"e1","kind":"heartbeat","observed_at":"2026-01-01T00:00:00Z","facts":` + facts + `}]}`)
		}
		enroll := func(fields string) apitest.Body {
			return rawJSON(`{"node_id":"` + boot.NodeID + `","generation":1,"enrollment_token":"` + boot.EnrollmentToken + `",` + fields + `}`)
		}
		deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
		long := strings.Repeat("x", 100<<10)

		cases := []hostile{
			// The administration API: bodies.
			{"TokenFieldInAnotherCase", "POST", "/api/v1/tokens", rawJSON(`{"NAME":"x"}`), "admin", 400, "invalid_json"},
			{"TokenFieldMixedCase", "POST", "/api/v1/tokens", rawJSON(`{"Name":"x"}`), "admin", 400, "invalid_json"},
			{"TokenFieldRepeated", "POST", "/api/v1/tokens", rawJSON(`{"name":"a","name":"b"}`), "admin", 400, "invalid_json"},
			{"TokenNameNull", "POST", "/api/v1/tokens", rawJSON(`{"name":null}`), "admin", 422, "validation_failed"},
			{"TokenNameBidiOverride", "POST", "/api/v1/tokens", rawJSON(`{"name":"invoice\u202etxt.exe"}`), "admin", 422, "validation_failed"},
			{"TokenNameBidiIsolate", "POST", "/api/v1/tokens", rawJSON(`{"name":"a\u2066b"}`), "admin", 422, "validation_failed"},
			{"TokenNameRightToLeftMark", "POST", "/api/v1/tokens", rawJSON(`{"name":"\u200fci"}`), "admin", 422, "validation_failed"},
			{"TokenNameControl", "POST", "/api/v1/tokens", rawJSON(`{"name":"bell\u0007"}`), "admin", 422, "validation_failed"},
			{"TokenNameNewline", "POST", "/api/v1/tokens", rawJSON(`{"name":"two\nlines"}`), "admin", 422, "validation_failed"},
			{"TokenNameNUL", "POST", "/api/v1/tokens", rawJSON(`{"name":"nul\u0000"}`), "admin", 422, "validation_failed"},
			{"TokenNameInvalidUTF8", "POST", "/api/v1/tokens", rawJSON("{\"name\":\"bad\xff\xfe\"}"), "admin", 422, "validation_failed"},
			{"TokenNameLoneSurrogate", "POST", "/api/v1/tokens", rawJSON(`{"name":"\ud800"}`), "admin", 422, "validation_failed"},
			{"TokenBodyNull", "POST", "/api/v1/tokens", rawJSON(`null`), "admin", 400, "invalid_json"},
			{"TokenBodyString", "POST", "/api/v1/tokens", rawJSON(`"ci"`), "admin", 400, "invalid_json"},
			{"TokenBodyDeeplyNested", "POST", "/api/v1/tokens", rawJSON(deep), "admin", 400, "invalid_json"},
			{"TokenHugeNumber", "POST", "/api/v1/tokens", rawJSON(`{"name":1e999}`), "admin", 400, "invalid_json"},
			{"TokenLookalikeMediaType", "POST", "/api/v1/tokens", apitest.Body{ContentType: "application/jsonx", Data: []byte(`{"name":"x"}`)}, "admin", 415, "unsupported_media_type"},
			{"TokenBadMediaType", "POST", "/api/v1/tokens", apitest.Body{ContentType: "application/json; charset=\"", Data: []byte(`{"name":"x"}`)}, "admin", 415, "unsupported_media_type"},
			{"InviteFieldInAnotherCase", "POST", "/api/v1/nodes/invitations", rawJSON(`{"Rental_ID":"r","generation":1}`), "admin", 400, "invalid_json"},
			{"InviteRentalNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":null,"generation":1}`), "admin", 422, "validation_failed"},
			{"InviteGenerationNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":null}`), "admin", 422, "validation_failed"},
			{"InvitePurchaseNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"purchase":null}`), "admin", 422, "validation_failed"},
			{"InvitePriceNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"shadow_price_usd_per_hour":null}`), "admin", 422, "validation_failed"},
			{"InviteThroughNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"redeemable_through":null}`), "admin", 422, "validation_failed"},
			{"InviteClassesNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"purchase":{"eligible_classes":null}}`), "admin", 422, "validation_failed"},
			{"InviteClassNull", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"purchase":{"eligible_classes":["a",null]}}`), "admin", 422, "validation_failed"},
			{"InviteNestedFieldInAnotherCase", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1,"purchase":{"Eligible_Classes":["a"]}}`), "admin", 400, "invalid_json"},
			{"InviteRentalBidi", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r\u202e1","generation":1}`), "admin", 422, "validation_failed"},
			{"InviteGenerationExponent", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":1e3}`), "admin", 400, "invalid_json"},
			{"InviteGenerationOverflow", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":99999999999999999999}`), "admin", 400, "invalid_json"},
			{"InviteGenerationNegative", "POST", "/api/v1/nodes/invitations", rawJSON(`{"rental_id":"r","generation":-1}`), "admin", 422, "validation_failed"},
			{"SubmitInviteNodeIDEmpty", "POST", "/api/v1/operations", rawJSON(`{"request_id":"h-t3","kind":"node.invite","operation":{"node_id":"","rental_id":"h-t3","generation":1}}`), "admin", 422, "validation_failed"},
			{"InviteNodeIDEmpty", "POST", "/api/v1/nodes/invitations", rawJSON(`{"node_id":"","rental_id":"h-t4","generation":1}`), "admin", 422, "validation_failed"},
			{"SubmitNodeTargetWithoutID", "POST", "/api/v1/operations", rawJSON(`{"request_id":"h-t1","kind":"node.invite","targets":[{"kind":"node"}],"operation":{"rental_id":"h-t1","generation":1}}`), "admin", 422, "validation_failed"},
			{"SubmitFleetTargetWithID", "POST", "/api/v1/operations", rawJSON(`{"request_id":"h-t2","kind":"fleet.command","targets":[{"kind":"fleet","id":"all"}],"operation":{"kind":"node.stop_workload","payload":{"run_id":"r","attempt_id":"a"},"selector":{}}}`), "admin", 422, "validation_failed"},
			{"CommandPayloadNull", "POST", node + "/commands", rawJSON(`{"kind":"prepare_image","operation_id":"op-h1","payload":null}`), "admin", 422, "validation_failed"},
			{"CommandFieldInAnotherCase", "POST", node + "/commands", rawJSON(`{"Kind":"prepare_image","operation_id":"op-h2","payload":{}}`), "admin", 400, "invalid_json"},
			{"RetireReasonNUL", "POST", node + "/retire", rawJSON(`{"reason":"gone\u0000"}`), "admin", 422, "validation_failed"},
			{"CommandPayloadNUL", "POST", node + "/commands", rawJSON(`{"kind":"prepare_image","operation_id":"op-h3","payload":{"image":"img\u0000"}}`), "admin", 422, "validation_failed"},
			{"RetireReasonNull", "POST", node + "/retire", rawJSON(`{"reason":null}`), "admin", 422, "validation_failed"},
			{"ReinviteThroughNull", "POST", node + "/reinvite", rawJSON(`{"redeemable_through":null}`), "admin", 422, "validation_failed"},
			// The administration API: queries and paths.
			{"NodesBeforeSigned", "GET", "/api/v1/nodes?before=+5", nil, "admin", 400, "invalid_parameter"},
			{"NodesLimitSigned", "GET", "/api/v1/nodes?limit=+5", nil, "admin", 400, "invalid_parameter"},
			{"NodesLimitEmpty", "GET", "/api/v1/nodes?limit=", nil, "admin", 400, "invalid_parameter"},
			{"NodesLimitSpace", "GET", "/api/v1/nodes?limit=%205", nil, "admin", 400, "invalid_parameter"},
			{"NodesStateEmpty", "GET", "/api/v1/nodes?state=", nil, "admin", 400, "invalid_parameter"},
			{"NodesStateTwice", "GET", "/api/v1/nodes?state=ready&state=lost", nil, "admin", 400, "invalid_parameter"},
			{"NodesCursorForged", "GET", "/api/v1/nodes?before=" + url.QueryEscape("KzV8aWQ"), nil, "admin", 400, "invalid_parameter"},
			{"OffersClassEmpty", "GET", "/api/v1/offers?class=", nil, "admin", 400, "invalid_parameter"},
			{"OffersClassTwice", "GET", "/api/v1/offers?class=a&class=b", nil, "admin", 400, "invalid_parameter"},
			{"OffersDiskSigned", "GET", "/api/v1/offers?min_free_disk_bytes=+1", nil, "admin", 400, "invalid_parameter"},
			{"OffersDiskNegative", "GET", "/api/v1/offers?min_free_disk_bytes=-1", nil, "admin", 400, "invalid_parameter"},
			{"OffersUntilWords", "GET", "/api/v1/offers?until=tomorrow", nil, "admin", 400, "invalid_parameter"},
			{"AuditBeforeSigned", "GET", "/api/v1/admin-audit?before=+5", nil, "admin", 400, "invalid_parameter"},
			{"AuditBeforeZero", "GET", "/api/v1/admin-audit?before=0", nil, "admin", 400, "invalid_parameter"},
			// Every numeric cursor is read as next_before wrote it: no padding.
			{"AuditBeforePadded", "GET", "/api/v1/admin-audit?before=007", nil, "admin", 400, "invalid_parameter"},
			{"SecretAuditTargetKindUnknown", "GET", "/api/v1/secret-audit?target_kind=bogus", nil, "admin", 400, "invalid_parameter"},
			{"SecretAuditBeforePadded", "GET", "/api/v1/secret-audit?before=007", nil, "admin", 400, "invalid_parameter"},
			{"OperationsBeforePadded", "GET", "/api/v1/node-operations?before=007", nil, "admin", 400, "invalid_parameter"},
			{"PackageHostsBeforePadded", "GET", "/api/v1/package-hosts?before=007", nil, "admin", 400, "invalid_parameter"},
			{"AuditMalformedQuery", "GET", "/api/v1/admin-audit?limit=%zz", nil, "admin", 400, "invalid_parameter"},
			{"AuditSemicolonQuery", "GET", "/api/v1/admin-audit?limit=5;before=1", nil, "admin", 400, "invalid_parameter"},
			{"NodeCommandsStateEmpty", "GET", node + "/commands?state=", nil, "admin", 400, "invalid_parameter"},
			{"NodeLongID", "GET", "/api/v1/nodes/" + long, nil, "admin", 404, "not_found"},
			{"APIUnknownPath", "GET", "/api/v1/" + long, nil, "admin", 404, "not_found"},
			{"NodeIDNUL", "GET", "/api/v1/nodes/a%00b", nil, "admin", 404, "not_found"},
			{"NodeIDInvalidUTF8", "POST", "/api/v1/nodes/%FF/retire", nil, "admin", 404, "not_found"},
			{"CommandIDTruncatedUTF8", "GET", "/api/v1/commands/%C3", nil, "admin", 404, "not_found"},
			{"TokenIDNUL", "POST", "/api/v1/tokens/%00/revoke", nil, "admin", 404, "not_found"},
			{"WorkloadIDControl", "GET", node + "/workloads/r%0A/a", nil, "admin", 404, "not_found"},
			{"NodesCursorNUL", "GET", "/api/v1/nodes?before=MXwA", nil, "admin", 400, "invalid_parameter"},
			{"OffersClassNUL", "GET", "/api/v1/offers?class=%00", nil, "admin", 400, "invalid_parameter"},
			{"OffersClassInvalidUTF8", "GET", "/api/v1/offers?class=%FF", nil, "admin", 400, "invalid_parameter"},
			{"APIPathNULAnonymous", "GET", "/api/v1/nodes/%00", nil, "", 401, "unauthenticated"},
			{"APIForgedCookie", "GET", "/api/v1/whoami", nil, "Cookie: nodeward_session=eyJhbGciOiJub25lIn0.e30.", 401, "unauthenticated"},
			{"APIHugeCookie", "GET", "/api/v1/whoami", nil, "Cookie: nodeward_session=" + strings.Repeat("A", 64<<10), 401, "unauthenticated"},
			{"APIHugeBearer", "GET", "/api/v1/whoami", nil, "Bearer nwa_" + strings.Repeat("A", 64<<10), 401, "unauthenticated"},
			{"APIHostileRequestID", "GET", "/api/v1/whoami", nil, "X-Request-Id: " + strings.Repeat("<script>", 1000), 401, "unauthenticated"},
			{"AgentCookieIsNoSession", "GET", "/agent/v1/commands?wait=0", nil, "Cookie: nodeward_session=x", 401, "session_invalid"},
			{"APIAnonymous", "POST", "/api/v1/tokens", rawJSON(`{"NAME":`), "", 401, "unauthenticated"},
			// The agent API without a session: 401 before anything else.
			{"AgentUnknownPathAnonymous", "GET", "/agent/v1/xyz", nil, "", 401, "session_invalid"},
			{"AgentRootAnonymous", "GET", "/agent/v1/", nil, "", 401, "session_invalid"},
			{"AgentWrongMethodAnonymous", "DELETE", "/agent/v1/commands", nil, "", 401, "session_invalid"},
			{"AgentMalformedBodyAnonymous", "POST", "/agent/v1/results", rawJSON(`{"results":`), "", 401, "session_invalid"},
			{"AgentWrongMediaTypeAnonymous", "POST", "/agent/v1/events", apitest.Body{ContentType: "text/plain", Data: []byte("x")}, "", 401, "session_invalid"},
			{"AgentBadQueryAnonymous", "GET", "/agent/v1/commands?wait=+5", nil, "", 401, "session_invalid"},
			{"AgentForgedSession", "GET", "/agent/v1/commands?wait=0", nil, "Bearer eyJhbGciOiJIUzI1NiJ9.e30.forged", 401, "session_invalid"},
			{"AgentEmptyBearer", "POST", "/agent/v1/session/renew", nil, "Bearer ", 401, "session_invalid"},
			{"AgentBasicAuth", "GET", "/agent/v1/commands?wait=0", nil, "Basic YWRtaW46YWRtaW4=", 401, "session_invalid"},
			{"AgentAdminTokenIsNoSession", "GET", "/agent/v1/commands?wait=0", nil, "Bearer " + s.AdminToken, 401, "session_invalid"},
			{"AgentLongUnknownPathAnonymous", "POST", "/agent/v1/" + long, nil, "", 401, "session_invalid"},
			// The agent API with a session.
			{"PollWaitSigned", "GET", "/agent/v1/commands?wait=+5", nil, "agent", 400, "invalid_parameter"},
			{"PollWaitEmpty", "GET", "/agent/v1/commands?wait=", nil, "agent", 400, "invalid_parameter"},
			{"PollWaitTooLong", "GET", "/agent/v1/commands?wait=61", nil, "agent", 400, "invalid_parameter"},
			{"PollWaitTwice", "GET", "/agent/v1/commands?wait=1&wait=2", nil, "agent", 400, "invalid_parameter"},
			{"AgentPathNULAnonymous", "GET", "/agent/v1/%00", nil, "", 401, "session_invalid"},
			{"AgentPathNUL", "GET", "/agent/v1/%00", nil, "agent", 404, "not_found"},
			{"AgentUnknownPath", "GET", "/agent/v1/xyz", nil, "agent", 404, "not_found"},
			{"AgentWrongMethod", "DELETE", "/agent/v1/commands", nil, "agent", 405, "method_not_allowed"},
			{"ResultsFieldInAnotherCase", "POST", "/agent/v1/results", rawJSON(`{"Results":[]}`), "agent", 400, "invalid_json"},
			{"ResultsNull", "POST", "/agent/v1/results", rawJSON(`{"results":null}`), "agent", 422, "validation_failed"},
			{"ResultsAbsent", "POST", "/agent/v1/results", rawJSON(`{}`), "agent", 422, "validation_failed"},
			{"EventsAbsent", "POST", "/agent/v1/events", rawJSON(`{}`), "agent", 422, "validation_failed"},
			{"ResultsItemNull", "POST", "/agent/v1/results", rawJSON(`{"results":[null]}`), "agent", 422, "validation_failed"},
			{"ResultsAppliedNull", "POST", "/agent/v1/results", rawJSON(`{"results":[{"operation_id":"op","applied":null}]}`), "agent", 422, "validation_failed"},
			{"EventsIDNUL", "POST", "/agent/v1/events", rawJSON(`{"events":[{"id":"e\u0000","kind":"workload","observed_at":"2026-01-01T00:00:00Z","workload":{"run_id":"r","attempt_id":"a","state":"running","observed_at":"2026-01-01T00:00:00Z"}}]}`), "agent", 422, "validation_failed"},
			{"ResultsFailureNUL", "POST", "/agent/v1/results", rawJSON(`{"results":[{"operation_id":"op-none","applied":false,"failure":"x\u0000"}]}`), "agent", 422, "validation_failed"},
			{"EventsExitCodeOverflow", "POST", "/agent/v1/events", rawJSON(`{"events":[{"id":"e3","kind":"workload","observed_at":"2026-01-01T00:00:00Z","workload":{"run_id":"r","attempt_id":"a","state":"exited","exit_code":99999999999,"observed_at":"2026-01-01T00:00:00Z"}}]}`), "agent", 422, "validation_failed"},
			{"EventsObservedNull", "POST", "/agent/v1/events", rawJSON(`{"events":[{"id":"e1","kind":"heartbeat","observed_at":null}]}`), "agent", 422, "validation_failed"},
			{"EventsHostnameBidi", "POST", "/agent/v1/events", heartbeat(strings.Replace(facts, `"h"`, `"h\u202e"`, 1)), "agent", 422, "validation_failed"},
			{"EventsLabelControl", "POST", "/agent/v1/events", heartbeat(strings.Replace(facts, `"runtimes"`, `"labels":{"role":"db\u001b[31m"},"runtimes"`, 1)), "agent", 422, "validation_failed"},
			{"EventsLabelNull", "POST", "/agent/v1/events", heartbeat(strings.Replace(facts, `"runtimes"`, `"labels":{"role":null},"runtimes"`, 1)), "agent", 422, "validation_failed"},
			{"EventsFactsInAnotherCase", "POST", "/agent/v1/events", heartbeat(strings.Replace(facts, `"hostname"`, `"HostName"`, 1)), "agent", 400, "invalid_json"},
			// Enrollment: it authenticates by its body.
			{"EnrollFieldInAnotherCase", "POST", "/agent/v1/enroll", rawJSON(`{"NODE_ID":"n","generation":1,"enrollment_token":"t","agent_version":"v","facts":` + facts + `}`), "", 400, "invalid_json"},
			{"EnrollNodeNull", "POST", "/agent/v1/enroll", rawJSON(`{"node_id":null,"generation":1,"enrollment_token":"t","agent_version":"v","facts":` + facts + `}`), "", 422, "validation_failed"},
			{"EnrollFactsNull", "POST", "/agent/v1/enroll", enroll(`"agent_version":"v","facts":null`), "", 422, "validation_failed"},
			{"EnrollHostnameControl", "POST", "/agent/v1/enroll", enroll(`"agent_version":"v","facts":` + strings.Replace(facts, `"h"`, `"h\r\nx"`, 1)), "", 422, "validation_failed"},
			{"EnrollVersionInvalidUTF8", "POST", "/agent/v1/enroll", enroll("\"agent_version\":\"v\xc0\",\"facts\":" + facts), "", 422, "validation_failed"},
			{"EnrollWrongMethod", "GET", "/agent/v1/enroll", nil, "", 405, "method_not_allowed"},
			// The console.
			{"ConsoleTokenNameBidi", "POST", "/console/tokens", form("name", "a\u202eb"), "console", 422, ""},
			{"ConsoleTokenNameControl", "POST", "/console/tokens", form("name", "a\x01b"), "console", 422, ""},
			{"ConsoleTokenNameInvalidUTF8", "POST", "/console/tokens", form("name", "a\xffb"), "console", 422, ""},
			{"ConsoleLoginNameNUL", "POST", "/console/login", url.Values{"username": {"admin\x00"}, "password": {"x"}}, "", 401, ""},
			{"ConsoleLoginNameInvalidUTF8", "POST", "/console/login", url.Values{"username": {"\xff"}, "password": {"x"}}, "", 401, ""},
			{"ConsoleRevokeIDNUL", "POST", "/console/tokens/%00/revoke", url.Values{"csrf_token": {csrf}}, "console", 404, ""},
			{"ConsolePathInvalidUTF8", "GET", "/console/%FF", nil, "console", 404, ""},
			{"ConsoleTokenWithoutCSRF", "POST", "/console/tokens", url.Values{"name": {"x"}}, "console", 403, ""},
			{"ConsoleAuditBeforeSigned", "GET", "/console/audit?before=+5", nil, "console", 400, ""},
			{"ConsoleAuditBeforePadded", "GET", "/console/audit?before=007", nil, "console", 400, ""},
			{"ConsolePackageHostsBeforePadded", "GET", "/console/package-hosts?before=007", nil, "console", 400, ""},
			{"ConsoleUnknownPage", "GET", "/console/" + long, nil, "console", 404, ""},
			{"StaticRoot", "GET", "/static/", nil, "", 404, ""},
			{"StaticMissing", "GET", "/static/nope.css", nil, "", 404, ""},
			{"StaticTraversal", "GET", "/static/../../etc/passwd", nil, "", 404, ""},
		}
		require.GreaterOrEqual(t, len(cases), 60)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := allRowCounts(t, s)
				var body any
				switch b := tc.body.(type) {
				case url.Values:
					body = apitest.Body{ContentType: "application/x-www-form-urlencoded", Data: []byte(b.Encode())}
				default:
					body = b
				}
				req := s.NewRequest(t, tc.method, tc.path, body, "")
				switch tc.as {
				case "":
				case "admin":
					req.Header.Set("Authorization", "Bearer "+s.AdminToken)
				case "agent":
					req.Header.Set("Authorization", "Bearer "+enrolled.SessionToken)
				case "console":
					req.AddCookie(&http.Cookie{Name: "nodeward_session", Value: cookie})
				default:
					if k, v, ok := strings.Cut(tc.as, ": "); ok && !strings.Contains(k, " ") {
						req.Header.Set(k, v) // a header of its own
					} else {
						req.Header.Set("Authorization", tc.as)
					}
				}
				status, h, raw := s.Send(t, req)
				tally.Record("hostile requests", status, tc.code)
				require.Less(t, status, 500, "answer: %.300s", raw)
				if tc.code != "" {
					p := apitest.RequireProblem(t, status, h, raw, tc.status, tc.code)
					if tc.code == "validation_failed" || tc.code == "invalid_parameter" {
						require.NotEmpty(t, p.Errors, "the field at fault is named")
					}
					if tc.status == http.StatusUnauthorized {
						require.NotEmpty(t, h.Get("WWW-Authenticate"))
					}
				} else {
					require.Equal(t, tc.status, status, "answer: %.300s", raw)
				}
				require.Less(t, len(raw), 16<<10, "an answer does not echo a long request")
				require.Equal(t, before, allRowCounts(t, s), "a refused request changed no row")
			})
		}
	})
}

// The console's tokens page shows no name the API refused: nothing was
// stored (checked above); a name that passes is shown as sent.
func TestDisplayableNameAccepted(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	tok := createToken(t, s, "déploiement — 部署 🚀")
	require.Equal(t, "déploiement — 部署 🚀", tok.Name)
	resp, err := http.Get(s.URL + "/static/console.css")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "a file is still served")
}
