package handlers_test

// Benchmarks of the agent API over real HTTP on loopback, against the real
// control plane started in-process (apitest) on every dialect of the run,
// at the production durability defaults. They run only with -bench; see
// BENCHMARKS.md.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/apitest"
	"github.com/nodeward/nodeward/models/dbtest"
)

// benchServer is a server plus plain (unchecked) HTTP clients: the
// contract-checking transport of apitest would dominate the figures.
type benchServer struct {
	*apitest.Server
	hc *http.Client
}

func eachBenchServer(b *testing.B, fn func(b *testing.B, s *benchServer)) {
	for _, d := range dbtest.Dialects(b) {
		b.Run(d, func(b *testing.B) {
			s := apitest.Start(b, apitest.WithDialect(d), apitest.WithLog(io.Discard))
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = 256
			b.Cleanup(tr.CloseIdleConnections)
			fn(b, &benchServer{Server: s, hc: &http.Client{Transport: tr}})
		})
	}
}

var benchN atomic.Int64

func benchName(prefix string) string { return prefix + strconv.FormatInt(benchN.Add(1), 36) }

// admin makes one admin API call and decodes the answer.
func (s *benchServer) admin(b testing.TB, method, path string, body any, want int, out any) {
	b.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	resp, err := s.hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		b.Fatalf("%s %s: %d: %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			b.Fatal(err)
		}
	}
}

func (s *benchServer) invite(b testing.TB) api.Bootstrap {
	b.Helper()
	var boot api.Bootstrap
	s.admin(b, "POST", "/api/v1/nodes/invitations", map[string]any{"rental_id": benchName("r"), "generation": 1}, http.StatusCreated, &boot)
	return boot
}

func (s *benchServer) agent(b testing.TB) *client.Client {
	b.Helper()
	c, err := client.New(client.Options{BaseURL: s.URL, AllowInsecureHTTP: true, HTTPClient: s.hc})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func benchEnrollReq(boot api.Bootstrap) api.EnrollRequest {
	return api.EnrollRequest{NodeID: boot.NodeID, Generation: boot.Generation, EnrollmentToken: boot.EnrollmentToken,
		AgentVersion: "0.0.0-test", Facts: agentFacts()}
}

// enrolled answers an agent client holding a fresh node's session.
func (s *benchServer) enrolled(b testing.TB) (*client.Client, string) {
	b.Helper()
	boot := s.invite(b)
	c := s.agent(b)
	resp, err := c.Enroll(context.Background(), benchEnrollReq(boot))
	if err != nil {
		b.Fatal(err)
	}
	c.SetSessionToken(resp.SessionToken)
	return c, boot.NodeID
}

// BenchmarkHTTPEnroll: POST /agent/v1/enroll, one per op; invitations are
// made outside the timer.
func BenchmarkHTTPEnroll(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		boots := make([]api.Bootstrap, b.N)
		for i := range boots {
			boots[i] = s.invite(b)
		}
		c := s.agent(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.Enroll(context.Background(), benchEnrollReq(boots[i])); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHTTPInvite: POST /api/v1/nodes/invitations, one per op.
func BenchmarkHTTPInvite(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s.invite(b)
		}
	})
}

// BenchmarkHTTPEventsWorkload: POST /agent/v1/events with 50 fresh workload
// events per op.
func BenchmarkHTTPEventsWorkload(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		c, _ := s.enrolled(b)
		obs := time.Now().UTC()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			evs := make([]api.Event, 50)
			for j := range evs {
				evs[j] = api.Event{ID: benchName("ev-"), Kind: api.EventWorkload, ObservedAt: obs, Workload: &api.WorkloadObservation{
					RunID: "run-" + strconv.Itoa(j), AttemptID: strconv.Itoa(i), State: api.WorkloadRunning, ObservedAt: obs}}
			}
			b.StartTimer()
			res, err := c.Events(context.Background(), evs)
			if err != nil {
				b.Fatal(err)
			}
			if res.Recorded != len(evs) {
				b.Fatalf("recorded %d of %d", res.Recorded, len(evs))
			}
		}
	})
}

// BenchmarkHTTPHeartbeat: POST /agent/v1/events with one heartbeat (with
// facts) per op, answered after its group commit (up to one 50 ms flush).
func BenchmarkHTTPHeartbeat(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		c, _ := s.enrolled(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			f := agentFacts()
			if _, err := c.Events(context.Background(), []api.Event{{ID: benchName("hb-"), Kind: api.EventHeartbeat,
				ObservedAt: time.Now().UTC(), Facts: &f}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHTTPCommandRoundTrip: the admin issues a command (POST
// /api/v1/nodes/{id}/commands), the agent fetches it (GET
// /agent/v1/commands?wait=0) and settles it (POST /agent/v1/results).
func BenchmarkHTTPCommandRoundTrip(b *testing.B) {
	eachBenchServer(b, func(b *testing.B, s *benchServer) {
		c, node := s.enrolled(b)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			op := benchName("op-")
			s.admin(b, "POST", "/api/v1/nodes/"+node+"/commands", map[string]any{"kind": api.KindLaunchWorkload, "operation_id": op,
				"payload": map[string]any{"run_id": "run-" + op, "attempt_id": "1", "command": "true"}}, http.StatusCreated, nil)
			got, err := c.Commands(ctx, 0)
			if err != nil || len(got.Commands) != 1 {
				b.Fatalf("poll: %+v, %v", got, err)
			}
			res, err := c.Results(ctx, []api.Result{{OperationID: op, Applied: true}})
			if err != nil || res.Settled[0].State != "applied" {
				b.Fatalf("results: %+v, %v", res, err)
			}
		}
	})
}
