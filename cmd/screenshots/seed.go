package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/core"
	"github.com/nodeward/nodeward/agent/runtime"
	"github.com/nodeward/nodeward/agent/state"
)

const adminUser, adminPassword = "ada", "screenshots correct horse battery"

// apiClient calls the control plane's API with an administrator's token.
type apiClient struct {
	base, token string
}

func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, res.Status, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// agents runs real agents in-process on the simulated runtime.
type agents struct {
	dir string
	log *slog.Logger

	mu      sync.Mutex // guards the following
	cancels []context.CancelFunc
	done    []chan struct{}
}

func (a *agents) start(ctx context.Context, b api.Bootstrap, labels map[string]string) error {
	store, err := state.Open(filepath.Join(a.dir, b.NodeID), state.Options{})
	if err != nil {
		return err
	}
	agent, err := core.New(core.Config{
		Store: store, Runtime: runtime.NewSimulated(), Bootstrap: &b, AllowInsecureHTTP: true,
		Labels: labels, Version: "1.4.2", Logger: a.log, PollWait: 5 * time.Second, RetireGrace: time.Second,
	})
	if err != nil {
		_ = store.Close()
		return err
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = store.Close() }()
		if err := agent.Run(actx); err != nil && !errors.Is(err, context.Canceled) {
			a.log.Warn("agent stopped", "node", b.NodeID, "err", err)
		}
	}()
	a.mu.Lock()
	a.cancels, a.done = append(a.cancels, cancel), append(a.done, done)
	a.mu.Unlock()
	return nil
}

func (a *agents) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, cancel := range a.cancels {
		cancel()
		select {
		case <-a.done[i]:
		case <-time.After(30 * time.Second):
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(ctx context.Context, what string, within time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// seeded names what the pages show.
type seeded struct {
	// Node is a ready node with a workload, configuration and history.
	Node string
	// Parent is a fan-out; Failed an operation that failed.
	Parent, Failed string
}

type operation struct {
	ID    string `json:"operation_id"`
	State string `json:"state"`
}

func (c *apiClient) submit(ctx context.Context, requestID, kind string, targets []map[string]any, op map[string]any) (string, error) {
	var o operation
	err := c.do(ctx, http.MethodPost, "/api/v1/operations", map[string]any{"request_id": requestID, "kind": kind,
		"targets": targets, "operation": op}, &o)
	return o.ID, err
}

// settle waits until the operation ends; it answers its state.
func (c *apiClient) settle(ctx context.Context, id string) (string, error) {
	var o operation
	err := waitFor(ctx, "operation "+id, 60*time.Second, func() (bool, error) {
		if err := c.do(ctx, http.MethodGet, "/api/v1/operations/"+id, nil, &o); err != nil {
			return false, err
		}
		return o.State != "pending" && o.State != "running", nil
	})
	return o.State, err
}

func node(id string) []map[string]any { return []map[string]any{{"kind": "node", "id": id}} }

// seed builds the fleet the pictures show: three nodes (two enrolled by
// agents, one invited and never enrolled), images prepared, a workload
// running, a fan-out over the fleet, a failed preparation, a node's
// configuration, a sealed secret and a package host.
func seed(ctx context.Context, c *apiClient, ag *agents) (seeded, error) {
	var s seeded
	invites := []struct {
		rental string
		price  string
		zone   string
		agent  bool
	}{
		{"rack-1-slot-1", "0.42", "eu-west-1a", true},
		{"rack-1-slot-2", "0.38", "eu-west-1b", true},
		{"rack-2-slot-7", "", "", false},
	}
	var ids []string
	for _, in := range invites {
		body := map[string]any{"rental_id": in.rental, "generation": 1}
		var b api.Bootstrap
		if err := c.do(ctx, http.MethodPost, "/api/v1/nodes/invitations", body, &b); err != nil {
			return s, err
		}
		if in.agent {
			ids = append(ids, b.NodeID)
			if err := ag.start(ctx, b, map[string]string{"zone": in.zone, "pool": "batch"}); err != nil {
				return s, err
			}
		}
	}
	for _, id := range ids {
		err := waitFor(ctx, "node "+id+" ready with a heartbeat", 60*time.Second, func() (bool, error) {
			var n struct {
				State         string  `json:"state"`
				LastHeartbeat *string `json:"last_heartbeat_at"`
			}
			if err := c.do(ctx, http.MethodGet, "/api/v1/nodes/"+id, nil, &n); err != nil {
				return false, err
			}
			return n.State == "ready" && n.LastHeartbeat != nil, nil
		})
		if err != nil {
			return s, err
		}
	}
	a, b := ids[0], ids[1]
	s.Node = a
	steps := []struct {
		request, kind string
		targets       []map[string]any
		op            map[string]any
	}{
		{"prepare-app-1", "node.prepare_image", node(a), map[string]any{"image": "registry.example/app:1.4"}},
		{"launch-web-1", "node.launch_workload", node(a), map[string]any{"run_id": "web-1", "attempt_id": "a1",
			"image": "registry.example/app:1.4", "command": "serve", "args": []string{"--port", "8080"}}},
		{"configure-site-1", "node.configure", node(a), map[string]any{"format": "nginx.site/v1",
			"document": map[string]any{"server_name": "app.example", "port": 8080}}},
		{"fleet-prepare-busybox", "fleet.command", []map[string]any{{"kind": "node", "id": a}, {"kind": "node", "id": b}},
			map[string]any{"kind": "node.prepare_image", "payload": map[string]any{"image": "busybox:1.36"}, "max_concurrency": 2}},
		{"prepare-api-2", "node.prepare_image", node(b), map[string]any{"image": "registry.example/api:2", "artifact_id": "api-2-bundle"}},
	}
	for _, st := range steps {
		id, err := c.submit(ctx, st.request, st.kind, st.targets, st.op)
		if err != nil {
			return s, err
		}
		state, err := c.settle(ctx, id)
		if err != nil {
			return s, err
		}
		switch st.kind {
		case "fleet.command":
			s.Parent = id
		}
		if state == "failed" {
			s.Failed = id
		}
	}
	if s.Failed == "" {
		return s, errors.New("the preparation from a missing artifact did not fail")
	}
	if err := c.do(ctx, http.MethodPost, "/api/v1/secrets/seal", map[string]any{"request_id": "seal-api-key",
		"target": map[string]any{"kind": "node", "id": a}, "field": "/env/API_KEY", "value": "example-not-a-secret"}, nil); err != nil {
		return s, err
	}
	if err := c.do(ctx, http.MethodPost, "/api/v1/package-hosts", map[string]any{"name": "deploy-bot",
		"families": []string{"nodes"}}, nil); err != nil {
		return s, err
	}
	if err := c.do(ctx, http.MethodPost, "/api/v1/tokens", map[string]any{"name": "ci-pipeline"}, nil); err != nil {
		return s, err
	}
	return s, nil
}
