package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"https://cp.example.com", false, true},
		{"http://cp.example.com", false, false},
		{"http://cp.example.com", true, false},
		{"http://127.0.0.1:8080", false, false},
		{"http://127.0.0.1:8080", true, true},
		{"http://127.9.9.9:8080", true, true},
		{"http://[::1]:8080", true, true},
		{"http://localhost:8080", true, true},
		{"ftp://cp.example.com", true, false},
		{"https://", false, false},
	} {
		_, err := CheckURL(tc.url, tc.insecure)
		if (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q, %v) = %v", tc.url, tc.insecure, err)
		}
	}
}

func TestClient(t *testing.T) {
	var gotAuth, gotWait, gotQuery string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		switch r.URL.Path {
		case "/agent/v1/enroll":
			var req api.EnrollRequest
			json.NewDecoder(r.Body).Decode(&req)
			if req.EnrollmentToken != "good" {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(409)
				w.Write([]byte(`{"title":"Conflict","status":409,"detail":"already redeemed","code":"enrollment_spent"}`))
				return
			}
			json.NewEncoder(w).Encode(api.EnrollResponse{NodeID: req.NodeID, SessionToken: "s1", FencingToken: 1})
		case "/agent/v1/commands":
			gotWait = r.URL.Query().Get("wait")
			gotQuery = r.URL.RawQuery
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(503)
			w.Write([]byte(`{"title":"Draining","status":503,"code":"draining"}`))
		case "/agent/v1/results":
			json.NewEncoder(w).Encode(api.ResultsResponse{Settled: []api.Settled{{OperationID: "op", State: "applied"}}})
		default:
			w.WriteHeader(502)
			w.Write([]byte("<html>bad gateway</html>"))
		}
	}))
	defer srv.Close()
	c, err := New(Options{BaseURL: srv.URL, AllowInsecureHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	_, err = c.Enroll(ctx, api.EnrollRequest{NodeID: "n", EnrollmentToken: "bad"})
	var ce *Error
	if !errors.As(err, &ce) || ce.Status != 409 || ce.Code != CodeEnrollmentSpent || !strings.Contains(err.Error(), "already redeemed") {
		t.Fatalf("enroll refusal = %#v", err)
	}
	if !errors.Is(err, &Error{Code: CodeEnrollmentSpent}) || CodeOf(err) != CodeEnrollmentSpent {
		t.Fatal("code matching")
	}
	resp, err := c.Enroll(ctx, api.EnrollRequest{NodeID: "n", EnrollmentToken: "good"})
	if err != nil || resp.SessionToken != "s1" || gotAuth != "" {
		t.Fatalf("enroll %+v %v auth %q", resp, err, gotAuth)
	}

	if _, err := c.Renew(ctx); CodeOf(err) != CodeSessionInvalid {
		t.Fatalf("renew without a session = %v", err)
	}
	c.SetSessionToken("s1")
	_, err = c.Commands(ctx, 25*time.Second)
	if !errors.As(err, &ce) || ce.Code != CodeDraining || ce.RetryAfter != 5*time.Second || gotWait != "25" || gotAuth != "Bearer s1" {
		t.Fatalf("commands = %#v wait=%q auth=%q", err, gotWait, gotAuth)
	}
	if gotQuery != "wait=25" {
		t.Fatalf("a plain poll sent %q", gotQuery)
	}
	if _, err = c.Poll(ctx, 5*time.Second, PollOptions{Resume: true}); gotQuery != "resume=true&wait=5" {
		t.Fatalf("a resuming poll sent %q (%v)", gotQuery, err)
	}
	rr, err := c.Results(ctx, []api.Result{{OperationID: "op", Applied: true}})
	if err != nil || rr.Settled[0].State != "applied" {
		t.Fatalf("results %+v %v", rr, err)
	}
	_, err = c.Events(ctx, nil)
	if !errors.As(err, &ce) || ce.Status != 502 || ce.Code != "" {
		t.Fatalf("non-problem error = %#v", err)
	}
	if _, err := c.Events(ctx, make([]api.Event, MaxEventBatch+1)); err == nil {
		t.Fatal("oversized batch sent")
	}
}

func TestPinnedCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.RenewResponse{SessionToken: "s2"})
	}))
	defer srv.Close()
	// Not pinned: the test server's self-signed CA is not trusted.
	c, _ := New(Options{BaseURL: srv.URL})
	c.SetSessionToken("s")
	if _, err := c.Renew(context.Background()); err == nil {
		t.Fatal("untrusted certificate accepted")
	}
	if _, err := New(Options{BaseURL: srv.URL, CACertificatePEM: "garbage"}); err == nil {
		t.Fatal("garbage CA accepted")
	}
}

// TestConnectionLost: what the server's process going away looks like to
// a poll (refused, cut before or during the answer) is told apart from
// answers and from a timeout.
func TestConnectionLost(t *testing.T) {
	ctx := context.Background()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer cut.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer slow.Close()
	answers := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"status":503,"code":"unavailable"}`))
	}))
	defer answers.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	refused := gone.URL
	gone.Close()

	poll := func(url string, timeout time.Duration) error {
		c, err := New(Options{BaseURL: url, AllowInsecureHTTP: true, RequestTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		c.SetSessionToken("s")
		_, err = c.Commands(ctx, 0)
		return err
	}
	for name, tc := range map[string]struct {
		err  error
		lost bool
	}{
		"refused":  {poll(refused, time.Second), true},
		"cut":      {poll(cut.URL, time.Second), true},
		"answered": {poll(answers.URL, time.Second), false},
		"timeout":  {poll(slow.URL, 50*time.Millisecond), false},
		"none":     {nil, false},
	} {
		if got := ConnectionLost(tc.err); got != tc.lost {
			t.Errorf("%s: ConnectionLost(%v) = %v", name, tc.err, got)
		}
	}
}
