package handlers_test

import (
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/handlers"
)

// TestQueryParametersAsTheContractSays sends every query parameter that
// openapi.yaml documents for an admin GET a set of ordinary and hostile
// values, one at a time, and requires the server to refuse exactly what
// the contract refuses (by the parameter's schema, or by the rules
// openapi.yaml states for every query parameter) with a 400
// invalid_parameter naming it, and never to answer 400 to a value the
// contract accepts. A script written against the contract then never
// meets a value one side takes and the other refuses.
func TestQueryParametersAsTheContractSays(t *testing.T) {
	t.Parallel()
	// Parameters are read before any store is asked: one dialect is enough.
	s := apitest.Start(t)
	var boot api.Bootstrap
	s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{
		"rental_id": apitest.RandomID("rental-"), "generation": 1}, http.StatusCreated, &boot)
	pathValues := map[string]string{"id": boot.NodeID}

	values := []string{
		"", " ", "0", "1", "5", "007", "+5", "-1", "1.5", "1e3", "0x10", "501", "1001",
		"9223372036854775807", "99999999999999999999", "x", "true",
		"ready", "retired", "pending", "succeeded", "node", "fleet", "admin", "package_host",
		"ok", "denied", "nodes", "commands", "node.invite", "fleet.command",
		"2026-12-04T00:00:00Z", "2026-12-04", "r1:a.b_c-d", "a b", "a\x00b", "\xff", strings.Repeat("a", 129),
	}
	contract := apitest.ProductContract(t)
	paths := contract.Doc.Paths.Map()
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	checked := 0
	for _, path := range names {
		item := paths[path]
		if item.Get == nil || !strings.HasPrefix(path, "/api/") {
			continue
		}
		concrete, ok := fillPath(path, pathValues)
		if !ok {
			continue
		}
		for _, ref := range append(append(openapi3.Parameters(nil), item.Parameters...), item.Get.Parameters...) {
			p := ref.Value
			if p.In != "query" {
				continue
			}
			for _, v := range values {
				target := concrete + "?" + url.Values{p.Name: {v}}.Encode()
				refusal := contract.CheckRequest(s.NewRequest(t, http.MethodGet, target, nil, s.AdminToken))
				if refusal == nil {
					refusal = generalRule(p, v)
				}
				status, h, raw := s.Send(t, s.NewRequest(t, http.MethodGet, target, nil, s.AdminToken))
				switch {
				case refusal != nil && status != http.StatusBadRequest:
					t.Errorf("GET %s: the contract refuses %s=%q (%v), the server answered %d %s", path, p.Name, v, refusal, status, raw)
				case refusal != nil:
					pr := apitest.RequireProblem(t, status, h, raw, http.StatusBadRequest, "invalid_parameter")
					if len(pr.Errors) == 0 || pr.Errors[0].Field != p.Name {
						t.Errorf("GET %s %s=%q: the refusal does not name the parameter: %s", path, p.Name, v, raw)
					}
				case status == http.StatusBadRequest && !strings.Contains(p.Description, "opaque"):
					// (An opaque cursor is one the server minted: anything
					// else is refused, which no schema can say.)
					t.Errorf("GET %s: the contract accepts %s=%q, the server refused it: %s", path, p.Name, v, raw)
				}
				checked++
			}
		}
	}
	require.Greater(t, checked, 30*len(values)/2, "the walk reached the listings' parameters")
}

// TestOnlyDocumentedQueryParameters: every /api operation takes exactly
// the query parameters openapi.yaml declares for it, and refuses any other
// with 400 invalid_parameter naming it, so a misspelt filter or a cursor
// an endpoint does not page by is never silently ignored.
func TestOnlyDocumentedQueryParameters(t *testing.T) {
	t.Parallel()
	s := apitest.Start(t)
	contract := apitest.ProductContract(t)
	served := handlers.APIQueryParameters()
	documented := 0
	for path, item := range contract.Doc.Paths.Map() {
		if !strings.HasPrefix(path, "/api/") {
			continue
		}
		for method, op := range item.Operations() {
			documented++
			key := method + " " + path
			want := []string{}
			for _, ref := range append(append(openapi3.Parameters(nil), item.Parameters...), op.Parameters...) {
				if ref.Value.In == "query" {
					want = append(want, ref.Value.Name)
				}
			}
			got, ok := served[key]
			require.True(t, ok, "%s is documented but not routed", key)
			require.ElementsMatch(t, want, append([]string{}, got...), "%s: the query parameters documented and served differ", key)

			concrete, filled := fillPath(path, map[string]string{"id": "n1", "run_id": "r1", "attempt_id": "a1", "operation_id": "o1", "handle": "h1", "username": "u1"})
			require.True(t, filled, "%s: a path parameter the walk has no value for", key)
			status, h, raw := s.Send(t, s.NewRequest(t, method, concrete+"?limt=5", nil, s.AdminToken))
			p := apitest.RequireProblem(t, status, h, raw, http.StatusBadRequest, "invalid_parameter")
			require.Len(t, p.Errors, 1, "%s", raw)
			require.Equal(t, "limt", p.Errors[0].Field, "%s names the unknown parameter", key)
		}
	}
	require.Len(t, served, documented, "every routed /api operation is documented")
}

// generalRule answers why openapi.yaml's rules for every query parameter
// (its description) refuse v for p where p's schema alone does not: a
// value given empty, one that is not valid UTF-8 or holds a control
// character, a number not in plain decimal digits; nil when they accept it.
func generalRule(p *openapi3.Parameter, v string) error {
	switch {
	case v == "":
		return errors.New("given empty")
	case !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl):
		return errors.New("not valid UTF-8 without control characters")
	case p.Schema.Value.Type.Is(openapi3.TypeInteger) && strings.Trim(v, "0123456789") != "":
		return errors.New("a number not in plain decimal digits")
	}
	return nil
}

// fillPath answers path with each {name} replaced from values; ok is false
// when it names one values does not have.
func fillPath(path string, values map[string]string) (string, bool) {
	var b strings.Builder
	for {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			b.WriteString(path)
			return b.String(), true
		}
		j := strings.IndexByte(path[i:], '}')
		v, ok := values[path[i+1:i+j]]
		if !ok {
			return "", false
		}
		b.WriteString(path[:i])
		b.WriteString(url.PathEscape(v))
		path = path[i+j+1:]
	}
}
