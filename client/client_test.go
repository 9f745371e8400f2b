package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/client"
)

// newClient is a client of s as its administrator, through the validating
// transport, so every exchange is also checked against openapi.yaml.
func newClient(t *testing.T, s *apitest.Server) *client.Client {
	t.Helper()
	c, err := client.New(s.URL, s.AdminToken, client.Options{HTTPClient: s.Client})
	require.NoError(t, err)
	return c
}

func invite(requestID string) client.SubmitRequest {
	return client.SubmitRequest{RequestID: requestID, Kind: client.KindNodeInvite,
		Operation: client.InviteOperation{RentalID: apitest.RandomID("rental-"), Generation: 1}}
}

func TestClientAgainstServer(t *testing.T) {
	t.Parallel()
	apitest.Each(t, func(t *testing.T, s *apitest.Server) {
		ctx := context.Background()
		c := newClient(t, s)

		req := invite("client-invite-1")
		req.Wait = time.Minute
		op, created, err := c.Submit(ctx, req)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, client.StateSucceeded, op.State)
		require.Equal(t, "client-invite-1", op.RequestID)
		var boot client.BootstrapResult
		require.NoError(t, op.DecodeResult(&boot))
		require.Equal(t, op.Targets[0].ID, boot.NodeID)
		nodeID := boot.NodeID

		again, created, err := c.Submit(ctx, req)
		require.NoError(t, err)
		require.False(t, created, "a replay is not created again")
		require.Equal(t, op.OperationID, again.OperationID)

		got, err := c.Get(ctx, op.OperationID)
		require.NoError(t, err)
		require.Equal(t, op.OperationID, got.OperationID)
		cancelled, err := c.Cancel(ctx, op.OperationID, "too late")
		require.NoError(t, err)
		require.Equal(t, client.StateSucceeded, cancelled.State, "an ended operation is answered unchanged")

		t.Run("TypedErrors", func(t *testing.T) {
			other := invite("client-invite-1")
			_, _, err := c.Submit(ctx, other)
			var e *client.Error
			require.True(t, errors.As(err, &e), "%v", err)
			require.Equal(t, http.StatusConflict, e.Status)
			require.Equal(t, client.CodeRequestConflict, e.Code)
			require.NotEmpty(t, e.Detail)
			require.NotEqual(t, "client-invite-1", e.HTTPRequestID)

			_, _, err = c.Submit(ctx, client.SubmitRequest{RequestID: "bad id", Kind: client.KindNodeInvite})
			require.True(t, errors.As(err, &e))
			require.Equal(t, http.StatusUnprocessableEntity, e.Status)
			require.Equal(t, client.CodeValidationFailed, e.Code)
			require.Equal(t, "request_id", e.Fields[0].Field)

			_, _, err = c.Submit(ctx, client.SubmitRequest{RequestID: "t-1", Kind: "node.teleport"})
			require.Equal(t, client.CodeKindNotServed, client.CodeOf(err))
			_, err = c.Get(ctx, "no-such-operation")
			require.Equal(t, client.CodeNotFound, client.CodeOf(err))
			_, _, err = c.List(ctx, client.Filter{State: "sleepy"})
			require.True(t, errors.As(err, &e))
			require.Equal(t, client.CodeInvalidParameter, e.Code)
			require.Equal(t, "state", e.Fields[0].Field)

			anon, err := client.New(s.URL, "nwa_forged", client.Options{HTTPClient: s.Client})
			require.NoError(t, err)
			_, err = anon.Get(ctx, op.OperationID)
			require.Equal(t, client.CodeUnauthenticated, client.CodeOf(err))
		})

		t.Run("Capabilities", func(t *testing.T) {
			caps, err := c.Capabilities(ctx)
			require.NoError(t, err)
			require.Equal(t, "0.0.0-test", caps.AgentVersion)
			k, ok := caps.Kind("node.launch_workload")
			require.True(t, ok)
			require.Equal(t, client.KindInfo{Kind: "node.launch_workload", Family: "commands", Capability: "commands.v1",
				LevelTriggered: true}, k)
			k, ok = caps.Kind("node.invite")
			require.True(t, ok)
			require.Empty(t, k.Capability, "the control plane runs it")
			require.EqualValues(t, 1<<20, caps.Limits["request_body_bytes"])
			require.EqualValues(t, 60000, caps.Limits["max_wait_ms"])
			require.EqualValues(t, 256, caps.Limits["package_host_quota"])
			require.EqualValues(t, 32, caps.Limits["node_quota"])
			require.Contains(t, caps.AgentCapabilities, "diag.v1")
		})

		t.Run("CapabilityMissing", func(t *testing.T) {
			var b api.Bootstrap
			s.Admin(t, http.MethodPost, "/api/v1/nodes/invitations", map[string]any{"rental_id": apitest.RandomID("r"), "generation": 1},
				http.StatusCreated, &b)
			s.JSON(t, http.MethodPost, "/agent/v1/enroll", api.EnrollRequest{NodeID: b.NodeID, Generation: 1, EnrollmentToken: b.EnrollmentToken,
				AgentVersion: "old", Facts: api.Facts{Hostname: "h", OS: "linux", Arch: "amd64", CPUs: 1, MemoryBytes: 1,
					AgentVersion: "old", Runtimes: []string{"process"}, ObservedAt: time.Now().UTC()}}, "", http.StatusOK, nil)
			_, _, err := c.Submit(ctx, client.SubmitRequest{RequestID: "diag-old", Kind: client.KindNodeDiagnose,
				Targets: []client.Target{client.NodeTarget(b.NodeID)}, Operation: client.DiagnoseOperation{Action: "clock"}})
			var e *client.Error
			require.True(t, errors.As(err, &e), "%v", err)
			require.Equal(t, http.StatusConflict, e.Status)
			require.Equal(t, client.CodeCapabilityMissing, e.Code)
			require.Equal(t, "diag.v1", e.Capability)
		})

		t.Run("ListPages", func(t *testing.T) {
			retire, _, err := c.Submit(ctx, client.SubmitRequest{RequestID: "client-retire-1", Kind: client.KindNodeRetire,
				Targets: []client.Target{client.NodeTarget(nodeID)}, Operation: client.RetireOperation{Reason: "test"}, Wait: time.Minute})
			require.NoError(t, err)
			var rr client.RetireResult
			require.NoError(t, retire.DecodeResult(&rr))
			require.Equal(t, "retired", rr.State)

			var seen []string
			f := client.Filter{TargetKind: "node", TargetID: nodeID, Limit: 1}
			for {
				ops, next, err := c.List(ctx, f)
				require.NoError(t, err)
				for _, o := range ops {
					seen = append(seen, o.OperationID)
				}
				if next == "" {
					break
				}
				f.Before = next
			}
			require.Equal(t, []string{retire.OperationID, op.OperationID}, seen, "newest first, each once")
		})

		t.Run("WatchAndResume", func(t *testing.T) {
			var all []client.Event
			require.NoError(t, c.Watch(ctx, op.OperationID, "", func(e client.Event) error {
				all = append(all, e)
				return nil
			}))
			require.Len(t, all, 3)
			require.Equal(t, []string{"submitted", "running", "succeeded"}, []string{all[0].Type, all[1].Type, all[2].Type})

			var rest []client.Event
			require.NoError(t, c.Watch(ctx, op.OperationID, all[0].Cursor, func(e client.Event) error {
				rest = append(rest, e)
				return nil
			}))
			require.Equal(t, all[1:], rest, "resumes after the event given")

			stop := errors.New("stop")
			require.ErrorIs(t, c.Watch(ctx, op.OperationID, "", func(client.Event) error { return stop }), stop)
			require.Equal(t, client.CodeNotFound, client.CodeOf(c.Watch(ctx, "no-such-operation", "", func(client.Event) error { return nil })))
		})
	})
}

// TestClientWatchResumes drives Watch against a server that ends its first
// stream with a drain and breaks its second mid-way: every event still
// arrives exactly once, each reconnection asking after the last one seen.
func TestClientWatchResumes(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	event := func(w http.ResponseWriter, n int, typ string) {
		fmt.Fprintf(w, "id: %d\nevent: %s\ndata: {\"cursor\":\"%d\",\"operation_id\":\"op-1\",\"type\":\"%s\",\"at\":\"2026-01-01T00:00:00Z\",\"data\":null}\n\n", n, typ, n, typ)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Path+"#"+r.Header.Get("Last-Event-ID"))
		call := len(asked)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		switch call {
		case 1:
			event(w, 1, "submitted")
			fmt.Fprint(w, "event: draining\ndata: {}\n\n")
		case 2:
			event(w, 2, "running")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks mid-stream
		default:
			event(w, 3, "succeeded")
		}
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, "tok", client.Options{ReconnectDelay: time.Millisecond})
	require.NoError(t, err)
	var got []string
	require.NoError(t, c.Watch(context.Background(), "op-1", "", func(e client.Event) error {
		got = append(got, e.Cursor+":"+e.Type)
		return nil
	}))
	require.Equal(t, []string{"1:submitted", "2:running", "3:succeeded"}, got)
	mu.Lock()
	defer mu.Unlock()
	const path = "/api/v1/operations/op-1/watch#"
	require.Equal(t, []string{path, path + "1", path + "2"}, asked, "each reconnection resumes after the last event seen")
}

// TestClientRetryAfter checks that a refusal's Retry-After reaches the
// caller (a quota or a drain), and that a stream that never progresses is
// given up.
func TestClientRetryAfter(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		if r.Method == http.MethodPost {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"x","title":"Too Many Requests","status":429,"detail":"node n has 32 operations not yet ended","code":"quota_exceeded","instance":"/api/v1/operations","request_id":"req-9"}`)
			return
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"type":"x","title":"Service Unavailable","status":503,"detail":"draining","code":"draining","instance":"/x","request_id":"req-10"}`)
	}))
	defer srv.Close()
	c, err := client.New(srv.URL+"/", "tok", client.Options{ReconnectDelay: time.Millisecond})
	require.NoError(t, err)
	_, _, err = c.Submit(context.Background(), invite("q-1"))
	var e *client.Error
	require.True(t, errors.As(err, &e), "%v", err)
	require.Equal(t, client.CodeQuotaExceeded, e.Code)
	require.Equal(t, 7*time.Second, e.RetryAfter)
	require.Equal(t, "req-9", e.HTTPRequestID)
	require.Contains(t, e.Error(), "quota_exceeded")

	calls.Store(0)
	err = c.Watch(context.Background(), "op-1", "", func(client.Event) error { return nil })
	require.Equal(t, client.CodeDraining, client.CodeOf(err))
	require.Equal(t, int32(5), calls.Load(), "gives up after streams that bring nothing new")
}
