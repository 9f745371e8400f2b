package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// floor is the deliver scenario's floor (issue 13): every request the load
// tool's deliver run makes, answered with what the contract's shapes need
// and nothing a control plane must do besides — no credentials checked, no
// database, no ledger, no redelivery. A command is held in its node's
// memory from submit until its result; a held poll is woken by a channel.
// Whatever rate the machine reaches here, with the same agents and issuers
// in the same sitting, is a ceiling the real server cannot pass: it makes
// the same HTTP exchanges and more besides.
type floor struct {
	url string

	mu    sync.RWMutex // guards nodes and ops
	nodes map[string]*floorNode
	ops   map[string]*fanOut // fleet.command operations by request id

	nodeSeq atomic.Int64
	held    atomic.Int64
	settled atomic.Int64
}

type floorNode struct {
	mu   sync.Mutex // guards due and out
	due  []api.Command
	out  map[string]*fanOut // handed out, awaiting a result (nil: a single command)
	wake chan struct{}      // capacity 1: a held poll's wake-up
}

// fanOut is a fleet.command operation: it succeeds when its last child's
// result arrives.
type fanOut struct {
	id   string
	left atomic.Int64
	done chan struct{}
}

func newFloor(url string) *floor {
	return &floor{url: url, nodes: map[string]*floorNode{}, ops: map[string]*fanOut{}}
}

func (f *floor) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/nodes/invitations", f.invite)
	mux.HandleFunc("POST /agent/v1/enroll", f.enroll)
	mux.HandleFunc("GET /agent/v1/commands", f.poll)
	mux.HandleFunc("POST /agent/v1/results", f.results)
	mux.HandleFunc("POST /api/v1/nodes/{id}/commands", f.command)
	mux.HandleFunc("POST /api/v1/operations", f.operation)
	mux.HandleFunc("GET /metrics", f.metrics)
	mux.HandleFunc("GET /held", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, f.held.Load()) })
}

func (f *floor) node(id string) *floorNode {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.nodes[id]
}

// ensure records node id, once.
func (f *floor) ensure(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodes[id] == nil {
		f.nodes[id] = &floorNode{out: map[string]*fanOut{}, wake: make(chan struct{}, 1)}
	}
}

// enqueue makes cmd due on its node and wakes the node's held poll.
func (n *floorNode) enqueue(cmd api.Command, parent *fanOut) {
	n.mu.Lock()
	n.due = append(n.due, cmd)
	n.out[cmd.OperationID] = parent
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// take hands out up to 100 due commands (the contract's most an answer carries).
func (n *floorNode) take() []api.Command {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := min(len(n.due), 100)
	got := n.due[:k:k]
	n.due = n.due[k:]
	return got
}

func (f *floor) invite(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RentalID   string `json:"rental_id"`
		Generation int64  `json:"generation"`
	}
	if !decode(w, r, &body) {
		return
	}
	id := "floor-" + strconv.FormatInt(f.nodeSeq.Add(1), 10)
	f.ensure(id)
	reply(w, http.StatusCreated, api.Bootstrap{NodeID: id, RentalID: body.RentalID, Generation: body.Generation,
		EnrollmentToken: id, ExpiresAt: time.Now().Add(30 * time.Minute).UTC(), ControlPlaneURL: f.url, AgentVersion: "loadtest"})
}

func (f *floor) enroll(w http.ResponseWriter, r *http.Request) {
	var body api.EnrollRequest
	if !decode(w, r, &body) {
		return
	}
	// Several floor processes stand for replicas sharing a database: the
	// node was invited through the first, and is enrolled wherever its
	// agent dials.
	f.ensure(body.EnrollmentToken)
	reply(w, http.StatusOK, api.EnrollResponse{NodeID: body.EnrollmentToken, SessionToken: body.EnrollmentToken,
		SessionExpiresAt: time.Now().Add(30 * time.Minute).UTC(), SessionTTLSeconds: 1800, FencingToken: 1,
		LeaseSeconds: 90, HeartbeatSeconds: 30})
}

// agentNode is the node whose session token (its id, here) the request carries.
func (f *floor) agentNode(w http.ResponseWriter, r *http.Request) *floorNode {
	n := f.node(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	if n == nil {
		http.Error(w, "unknown session", http.StatusUnauthorized)
	}
	return n
}

func (f *floor) poll(w http.ResponseWriter, r *http.Request) {
	n := f.agentNode(w, r)
	if n == nil {
		return
	}
	wait, err := strconv.Atoi(r.URL.Query().Get("wait"))
	if err != nil || wait < 0 || wait > 60 {
		wait = 25
	}
	cmds := n.take()
	if len(cmds) == 0 && wait > 0 {
		f.held.Add(1)
		t := time.NewTimer(time.Duration(wait) * time.Second)
		// A wake-up left over from a command an earlier answer already
		// carried finds nothing due: keep waiting.
		for len(cmds) == 0 {
			select {
			case <-n.wake:
				cmds = n.take()
				continue
			case <-t.C:
			case <-r.Context().Done():
			}
			break
		}
		t.Stop()
		f.held.Add(-1)
	}
	if cmds == nil {
		cmds = []api.Command{}
	}
	reply(w, http.StatusOK, api.CommandsResponse{Commands: cmds})
}

func (f *floor) results(w http.ResponseWriter, r *http.Request) {
	n := f.agentNode(w, r)
	if n == nil {
		return
	}
	var body api.ResultsRequest
	if !decode(w, r, &body) {
		return
	}
	settled := make([]api.Settled, len(body.Results))
	for i, res := range body.Results {
		settled[i].OperationID = res.OperationID
		n.mu.Lock()
		parent, ok := n.out[res.OperationID]
		delete(n.out, res.OperationID)
		n.mu.Unlock()
		if !ok {
			settled[i].Code = "unknown_operation"
			continue
		}
		settled[i].State = "applied"
		f.settled.Add(1)
		if parent != nil && parent.left.Add(-1) == 0 {
			close(parent.done)
		}
	}
	reply(w, http.StatusOK, api.ResultsResponse{Settled: settled})
}

func (f *floor) command(w http.ResponseWriter, r *http.Request) {
	n := f.node(r.PathValue("id"))
	if n == nil {
		http.Error(w, "no such node", http.StatusNotFound)
		return
	}
	var body struct {
		Kind        string          `json:"kind"`
		OperationID string          `json:"operation_id"`
		Payload     json.RawMessage `json:"payload"`
	}
	if !decode(w, r, &body) {
		return
	}
	cmd := api.Command{OperationID: body.OperationID, NodeID: r.PathValue("id"), Kind: body.Kind, FencingToken: 1,
		IssuedAt: time.Now().UTC(), Payload: body.Payload}
	n.enqueue(cmd, nil)
	reply(w, http.StatusCreated, map[string]any{"operation_id": cmd.OperationID, "node_id": cmd.NodeID, "kind": cmd.Kind,
		"state": "pending", "issued_at": cmd.IssuedAt})
}

// operation serves fleet.command over a list of node targets: one child
// per node, handed out at once; a replay of the request id waits on the
// same operation, as the ledger's does.
func (f *floor) operation(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RequestID string `json:"request_id"`
		Kind      string `json:"kind"`
		Targets   []struct {
			Kind string `json:"kind"`
			ID   string `json:"id"`
		} `json:"targets"`
		Operation struct {
			Kind           string          `json:"kind"`
			Payload        json.RawMessage `json:"payload"`
			MaxConcurrency int             `json:"max_concurrency"`
		} `json:"operation"`
		WaitTimeoutMS int64 `json:"wait_timeout_ms"`
	}
	if !decode(w, r, &body) {
		return
	}
	if body.Kind != "fleet.command" {
		http.Error(w, "the floor serves fleet.command only", http.StatusNotImplemented)
		return
	}
	status := http.StatusOK
	f.mu.Lock()
	op := f.ops[body.RequestID]
	if op == nil {
		status = http.StatusCreated
		op = &fanOut{id: body.RequestID, done: make(chan struct{})}
		op.left.Store(int64(len(body.Targets)))
		f.ops[body.RequestID] = op
	}
	f.mu.Unlock()
	if status == http.StatusCreated {
		kind := strings.TrimPrefix(body.Operation.Kind, "node.")
		now := time.Now().UTC()
		for i, t := range body.Targets {
			n := f.node(t.ID)
			if n == nil {
				http.Error(w, "no such node "+t.ID, http.StatusUnprocessableEntity)
				return
			}
			n.enqueue(api.Command{OperationID: body.RequestID + "." + strconv.Itoa(i), NodeID: t.ID, Kind: kind,
				FencingToken: 1, IssuedAt: now, Payload: body.Operation.Payload}, op)
		}
		if len(body.Targets) == 0 {
			close(op.done)
		}
	}
	state := "running"
	if body.WaitTimeoutMS > 0 {
		t := time.NewTimer(time.Duration(min(body.WaitTimeoutMS, 60000)) * time.Millisecond)
		select {
		case <-op.done:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	select {
	case <-op.done:
		state = "succeeded"
	default:
	}
	reply(w, status, map[string]any{"operation_id": op.id, "request_id": op.id, "kind": "fleet.command", "state": state})
}

// metrics answers the series the load tool reads, named as the server's.
func (f *floor) metrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "nodeward_open_long_polls %d\n", f.held.Load())
	fmt.Fprintf(w, "nodeward_commands_settled_total{state=\"applied\"} %d\n", f.settled.Load())
}

// decode reads a JSON body as the server does: unknown fields and trailing
// data refused.
func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil || dec.More() {
		http.Error(w, "invalid JSON", http.StatusBadRequest)
		return false
	}
	return true
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
