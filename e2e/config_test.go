package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/nodeward/nodeward/internal/testwait"
)

func configureNode(t *testing.T, s *Server, requestID, node string, document any) {
	t.Helper()
	s.API(t, "POST", "/api/v1/operations", map[string]any{"request_id": requestID, "kind": "node.configure",
		"targets": []any{map[string]any{"kind": "node", "id": node}}, "operation": map[string]any{"format": "e2e/v1", "document": document}}, 201, nil)
}

// TestConfigTwoReplicas: a configuration written on A wakes the long-poll
// held by B through NOTIFY, and B's answer carries it.
func TestConfigTwoReplicas(t *testing.T) {
	url := pgURL(t)
	a := StartServer(t, ServerOptions{DatabaseURL: url, Replica: "replica-a"})
	b := StartServer(t, ServerOptions{DatabaseURL: url, Replica: "replica-b", Token: a.Token})
	boot, viaA := enrollNode(t, a)
	viaB := asClient(t, b.URL, viaA)

	notifyBefore := metric(t, b, `nodeward_long_poll_wakeups_total{source="notify"}`)
	held := pollAsync(viaB, 50*time.Second)
	testwait.For(t, "B to hold the poll", 20*time.Second, func() bool { return metric(t, b, "nodeward_open_long_polls") == 1 })
	configureNode(t, a, "cfg-cross-1", boot.NodeID, map[string]any{"x": 1})
	got := awaitPoll(t, held)
	if got.err != nil || got.resp.Config == nil || got.resp.Config.Revision != 1 {
		t.Fatalf("poll on B: %+v %v", got.resp, got.err)
	}
	if n := metric(t, b, `nodeward_long_poll_wakeups_total{source="notify"}`); n < notifyBefore+1 {
		t.Fatalf("B was not woken by a notification (notify wake-ups %v -> %v)", notifyBefore, n)
	}
}

// TestConfigSurvivesServerRestart: configuration is state: a node polling
// after a restart still gets it.
func TestConfigSurvivesServerRestart(t *testing.T) {
	s := StartServer(t, ServerOptions{})
	boot, c := enrollNode(t, s)
	configureNode(t, s, "cfg-restart", boot.NodeID, map[string]any{"kept": true})
	s.Stop(t, syscall.SIGTERM)
	s.Start(t)
	resp, err := c.Commands(context.Background(), 5*time.Second)
	if err != nil || resp.Config == nil || resp.Config.Revision != 1 || string(resp.Config.Document) != `{"kept":true}` {
		t.Fatalf("after restart: %+v %v", resp, err)
	}
}
