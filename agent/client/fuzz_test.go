package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// FuzzAnswers: whatever a control plane (or something pretending to be
// one) answers — any status, any body — the agent's client returns a value
// or an error; it never panics and never hangs.
func FuzzAnswers(f *testing.F) {
	f.Add(200, []byte(`{"commands":[{"operation_id":"a","kind":"launch_workload","fencing_token":1,"payload":{}}]}`), "application/json")
	f.Add(409, []byte(`{"type":"x","title":"Conflict","status":409,"code":"fenced"}`), "application/problem+json")
	f.Add(503, []byte(`{"code":"draining"}`), "application/problem+json")
	f.Add(200, []byte(`{"settled":[{"operation_id":"a","state":"applied"}]}`), "application/json")
	f.Add(200, []byte(`{"session_token":"t","session_expires_at":"2026-01-01T00:00:00Z","session_ttl_seconds":-1}`), "application/json")
	f.Add(500, []byte(`<html>`), "text/html")
	f.Fuzz(func(t *testing.T, status int, body []byte, ct string) {
		if status < 200 || status > 599 || strings.ContainsFunc(ct, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return // informational answers and header injection are the HTTP stack's, not ours
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(status)
			_, _ = w.Write(body)
		}))
		defer srv.Close()
		c, err := New(Options{BaseURL: srv.URL, AllowInsecureHTTP: true, RequestTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c.SetSessionToken("tok")
		ctx := context.Background()
		_, _ = c.Commands(ctx, 0)
		_, _ = c.Results(ctx, []api.Result{{OperationID: "a", Applied: true}})
		_, _ = c.Events(ctx, nil)
		_, _ = c.Renew(ctx)
		_, _ = c.Enroll(ctx, api.EnrollRequest{NodeID: "n"})
		_, _ = c.Output(ctx, api.OutputRequest{RunID: "r", AttemptID: "a"})
	})
}
