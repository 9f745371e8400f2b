package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nodeward/nodeward/internal/testwait"
)

// issued is one command the API accepted.
type issued struct {
	ID, Node, Run string
}

// stream issues commands to nodes through the API, one after another at a
// steady pace, while a fault test breaks things around it. Each command is
// retried with the same Idempotency-Key until the API answers it, so an
// answer lost to a dying server is recovered, never issued twice.
type stream struct {
	t       testing.TB
	base    func() string // the API's base URL now (a server, a proxy)
	token   string
	nodes   []string
	prefix  string
	payload func(run string) (kind string, payload any)
	pace    time.Duration

	mu       sync.Mutex // guards the following
	ops      []issued
	codes    map[string]int // answers other than 2xx, by problem code
	replays  int            // 200 answers: a retry found the first attempt recorded
	rejected []string

	stop chan struct{}
	done chan struct{}
}

func (s *stream) start() {
	s.codes = map[string]int{}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		tick := time.NewTicker(s.pace)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.issue(fmt.Sprintf("%s-%04d", s.prefix, i), s.nodes[i%len(s.nodes)])
		}
	}()
}

// finish stops issuing and answers what was accepted.
func (s *stream) finish() []issued {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]issued(nil), s.ops...)
}

// issue submits one command until the API answers it; it answers whether
// the command was accepted.
func (s *stream) issue(id, node string) bool {
	kind, payload := s.payload(id)
	body := map[string]any{"kind": kind, "operation_id": id, "payload": payload}
	h := http.Header{"Idempotency-Key": {id}}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		status, raw, err := TryCall(s.base(), http.MethodPost, "/api/v1/nodes/"+node+"/commands", body, s.token, h)
		s.mu.Lock()
		switch {
		case err != nil:
			s.codes["transport_error"]++
		case status == http.StatusCreated || status == http.StatusOK:
			if status == http.StatusOK {
				s.replays++
			}
			s.ops = append(s.ops, issued{ID: id, Node: node, Run: id})
			s.mu.Unlock()
			return true
		case status >= 500 || status == http.StatusTooManyRequests:
			s.codes[fmt.Sprintf("%d %s", status, ProblemCode(raw))]++
		default:
			s.codes[fmt.Sprintf("%d %s", status, ProblemCode(raw))]++
			s.rejected = append(s.rejected, fmt.Sprintf("%s: %d %s", id, status, raw))
			s.mu.Unlock()
			return false
		}
		s.mu.Unlock()
		select {
		case <-time.After(100 * time.Millisecond): // retry pacing, not a wait for a condition
		case <-s.stop:
			// Keep trying even when stopping: an accepted-but-unanswered
			// command must be accounted for.
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.t.Errorf("command %s: the API did not answer within 3 minutes", id)
	return false
}

// commandState reads one command's state through the API ("" on failure).
func commandState(base, token, id string) string {
	status, raw, err := TryCall(base, http.MethodGet, "/api/v1/commands/"+id, nil, token, nil)
	if err != nil || status != http.StatusOK {
		return ""
	}
	var c commandRecord
	_ = json.Unmarshal(raw, &c)
	return c.State
}

// probe issues one command and answers how long it took from since until
// the node applied it: the recovery time of the fault that happened at since.
func (s *stream) probe(id, node string, since time.Time) time.Duration {
	s.t.Helper()
	if !s.issue(id, node) {
		s.t.Fatalf("probe %s was refused", id)
	}
	testwait.For(s.t, "probe "+id+" to be applied", 5*time.Minute, func() bool {
		return commandState(s.base(), s.token, id) == "applied"
	})
	return time.Since(since)
}

// verifyExactlyOnce waits for every accepted command to settle, then checks
// the promise on both sides: the server says applied, the ledger operation
// succeeded, the node's agent recorded it done in its journal, and its
// effect happened exactly once (effects counts it per operation id).
func verifyExactlyOnce(t testing.TB, f *Figures, base, token string, ops []issued, stateDirs map[string]string, effects func(op issued) int) {
	t.Helper()
	f.Issued = len(ops)
	deadline := time.Now().Add(5 * time.Minute)
	unsettled := map[string]bool{}
	for _, op := range ops {
		unsettled[op.ID] = true
	}
	testwait.For(t, "every accepted command to settle", 6*time.Minute, func() bool {
		for _, op := range ops {
			if !unsettled[op.ID] {
				continue
			}
			if st := commandState(base, token, op.ID); st != "" && st != "pending" {
				delete(unsettled, op.ID)
			}
		}
		return len(unsettled) == 0 || time.Now().After(deadline)
	})
	for _, op := range ops {
		state := commandState(base, token, op.ID)
		var ledgerOp struct {
			State string `json:"state"`
		}
		status, raw, err := TryCall(base, http.MethodGet, "/api/v1/operations/"+op.ID, nil, token, nil)
		if err == nil && status == http.StatusOK {
			_ = json.Unmarshal(raw, &ledgerOp)
		}
		rec, journaled, jerr := readJournal(stateDirs[op.Node], op.ID)
		if jerr != nil {
			t.Errorf("%s: %v", op.ID, jerr)
		}
		n := effects(op)
		switch {
		case state == "":
			f.Lost++
			t.Errorf("%s: accepted by the API, unknown to the server afterwards (lost)", op.ID)
		case state == "pending":
			f.Pending++
			t.Errorf("%s: still pending after 5 minutes", op.ID)
		case state == "applied":
			f.Applied++
			if ledgerOp.State != "succeeded" {
				t.Errorf("%s: command applied, ledger operation %q (%s)", op.ID, ledgerOp.State, raw)
			}
		default:
			f.Refused++
			t.Errorf("%s: ended %s, want applied", op.ID, state)
		}
		if !journaled || rec.State != "done" {
			if state == "applied" {
				f.Lost++
			}
			t.Errorf("%s: the agent's journal has %+v (recorded %v), want done", op.ID, rec, journaled)
		}
		switch {
		case n > 1:
			f.Duplicated++
			t.Errorf("%s: applied %d times on its node", op.ID, n)
		case n == 0 && state == "applied":
			f.Lost++
			t.Errorf("%s: the server says applied, the node has no effect of it", op.ID)
		}
	}
}

// launchCounts counts, per operation id, the launches the agents' logs
// report (every run of each process): a launch is logged once per effect.
// The logs are read at the first call, which verifyExactlyOnce makes only
// after every command settled.
func launchCounts(agents ...*Agent) func(op issued) int {
	var once sync.Once
	n := map[string]int{}
	return func(op issued) int {
		once.Do(func() {
			for _, a := range agents {
				for _, rec := range a.Logs("workload launched") {
					if id, ok := rec["operation_id"].(string); ok {
						n[id]++
					}
				}
			}
		})
		return n[op.ID]
	}
}
