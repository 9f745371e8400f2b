package core

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeward/nodeward/agent/api"
)

// fakeClock is a Clock that moves only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	clk   *fakeClock
	c     chan time.Time
	at    time.Time
	d     time.Duration
	fired bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clk: c, c: make(chan time.Time, 1), at: c.now.Add(d), d: d}
	if d <= 0 {
		t.fired = true
		t.c <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	if t.fired {
		return false
	}
	t.clk.timers = slices.DeleteFunc(t.clk.timers, func(x *fakeTimer) bool { return x == t })
	return true
}

// Advance moves time forward and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.fired = true
			t.c <- c.now
			continue
		}
		keep = append(keep, t)
	}
	c.timers = keep
}

// pending lists the durations of the timers armed now.
func (c *fakeClock) pending() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, t := range c.timers {
		out = append(out, t.d)
	}
	return out
}

// fakeCP is a minimal in-process control plane speaking the agent API.
type fakeCP struct {
	t   *testing.T
	srv *httptest.Server
	clk *fakeClock

	mu            sync.Mutex
	enrollToken   string
	spent         bool
	retired       bool
	fencing       int64
	tokens        map[string]int64     // session token -> fencing token
	expiresAt     map[string]time.Time // session token -> expiry (fake clock), enforced when enforceExpiry
	enforceExpiry bool
	renewDown     bool // answer 503 to every renewal
	ttl           int64
	heartbeatSec  int64
	queue         []api.Command
	wake          chan struct{}
	pollScript    []func(http.ResponseWriter) // answers for the next polls, in order
	eventsDown    int                         // answer 503 to this many events posts
	enrolls       []api.EnrollRequest         // enrollments committed
	enrollTries   []api.EnrollRequest         // every enroll request
	enrollNonce   string                      // the nonce the committed enrollment carried
	enrollCuts    int                         // cut this many committed enrollments' answers
	enrollSlow    int                         // answer this many enrollments 408 request_timeout (the body came too slowly)
	renews        int
	activePolls   int         // poll handlers running now
	pollTimes     []time.Time // fake-clock time of each poll
	pollTokens    []string
	pollResumes   []bool        // each poll's resume=true
	pollWaits     []string      // each poll's wait=
	onResume      []api.Command // a resuming poll's answer: what the server holds delivered and unsettled
	results       []api.Result
	events        []api.Event
	eventIDs      map[string]bool
	outputDown    int                          // answer 503 to this many output posts
	outputPosts   int                          // output posts answered 200
	outputRefuse  []string                     // run/attempt of each output post answered 422
	refuseOutput  bool                         // answer 422 to every output post
	outputs       map[string]api.OutputRequest // by run/attempt, the first kept

	// Desired configuration, served as DECISIONS.md §32 says: due while the
	// last report does not name the desired revision and hash (a failed
	// report for them stops it until forced); a due configuration answers
	// a held poll at once unless delivered to this fencing token in the
	// last 60 s (fake clock), else it rides along with the next answer;
	// enrollment makes it due again whatever the last report said.
	cfgDesired     *api.ConfigDelivery
	cfgForced      bool
	cfgLast        *api.ConfigReport // the last report, in arrival order
	cfgReports     []api.Event       // every config report recorded
	cfgDeliveries  int               // poll answers that carried config
	cfgDeliveredAt time.Time
	cfgDeliveredTo int64 // fencing token of the last delivery
}

func newFakeCP(t *testing.T, clk *fakeClock) *fakeCP {
	cp := &fakeCP{
		t: t, clk: clk, enrollToken: "enroll-secret", tokens: map[string]int64{}, expiresAt: map[string]time.Time{},
		ttl: 1800, heartbeatSec: 30, wake: make(chan struct{}, 1), eventIDs: map[string]bool{},
		outputs: map[string]api.OutputRequest{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /agent/v1/enroll", cp.enroll)
	mux.HandleFunc("POST /agent/v1/session/renew", cp.auth(cp.renew, false))
	mux.HandleFunc("GET /agent/v1/commands", cp.auth(cp.commands, false))
	mux.HandleFunc("POST /agent/v1/results", cp.auth(cp.resultsH, true))
	mux.HandleFunc("POST /agent/v1/events", cp.auth(cp.eventsH, true))
	mux.HandleFunc("POST /agent/v1/output", cp.auth(cp.outputH, true))
	cp.srv = httptest.NewServer(mux)
	t.Cleanup(cp.srv.Close)
	return cp
}

// cutAnswer cuts the poll's connection partway through its answer, as a
// control plane killed while answering does. (A connection closed before
// any answer may be retried by the HTTP transport itself, unseen by the
// agent, so the tests cut one that has begun.)
func cutAnswer(w http.ResponseWriter) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"commands\":[")
	buf.Flush()
	conn.Close()
}

func problem(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Problem{Title: http.StatusText(status), Status: status, Code: code, Detail: code})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (cp *fakeCP) bootstrap() *api.Bootstrap {
	return &api.Bootstrap{NodeID: "node-1", RentalID: "rental-1", Generation: 1, EnrollmentToken: cp.enrollToken,
		ControlPlaneURL: cp.srv.URL, AgentVersion: "test"}
}

func (cp *fakeCP) enroll(w http.ResponseWriter, r *http.Request) {
	var req api.EnrollRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		problem(w, 400, "invalid_json")
		return
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.enrollTries = append(cp.enrollTries, req)
	if cp.enrollSlow > 0 {
		cp.enrollSlow--
		problem(w, http.StatusRequestTimeout, "request_timeout")
		return
	}
	again := cp.spent && req.EnrollmentNonce != "" && req.EnrollmentNonce == cp.enrollNonce
	switch {
	case cp.retired:
		problem(w, 410, "node_retired")
		return
	case req.EnrollmentToken != cp.enrollToken:
		problem(w, 401, "enrollment_invalid")
		return
	case cp.spent && !again:
		problem(w, 409, "enrollment_spent")
		return
	}
	if again { // the server's answer to its own agent's retry: same fencing
		writeJSON(w, api.EnrollResponse{NodeID: req.NodeID, SessionToken: fmt.Sprintf("session-%d", cp.fencing),
			SessionExpiresAt: cp.clk.Now().Add(time.Duration(cp.ttl) * time.Second), SessionTTLSeconds: cp.ttl,
			FencingToken: cp.fencing, LeaseSeconds: 90, HeartbeatSeconds: cp.heartbeatSec})
		return
	}
	cp.spent = true
	cp.enrollNonce = req.EnrollmentNonce
	cp.fencing++
	cp.cfgLast = nil // a fencing bump makes the configuration due again
	cp.enrolls = append(cp.enrolls, req)
	cp.results = append(cp.results, req.UnacknowledgedResults...)
	tok := fmt.Sprintf("session-%d", cp.fencing)
	cp.tokens[tok] = cp.fencing
	cp.expiresAt[tok] = cp.clk.Now().Add(time.Duration(cp.ttl) * time.Second)
	if cp.enrollCuts > 0 {
		cp.enrollCuts--
		cutAnswer(w)
		return
	}
	writeJSON(w, api.EnrollResponse{NodeID: req.NodeID, SessionToken: tok, SessionExpiresAt: cp.clk.Now().Add(time.Duration(cp.ttl) * time.Second),
		SessionTTLSeconds: cp.ttl, FencingToken: cp.fencing, LeaseSeconds: 90, HeartbeatSeconds: cp.heartbeatSec})
}

// auth checks the bearer session; reporting doors stay open to a retired node.
func (cp *fakeCP) auth(h http.HandlerFunc, reporting bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		cp.mu.Lock()
		f, ok := cp.tokens[tok]
		if exp, has := cp.expiresAt[tok]; ok && has && cp.enforceExpiry && !cp.clk.Now().Before(exp) {
			ok = false // expired: refused as a forged one is
		}
		fenced := ok && f != cp.fencing
		retired := cp.retired
		cp.mu.Unlock()
		switch {
		case !ok:
			problem(w, 401, "session_invalid")
		case fenced:
			problem(w, 409, "fenced")
		case retired && !reporting:
			problem(w, 410, "node_retired")
		default:
			h(w, r)
		}
	}
}

func (cp *fakeCP) renew(w http.ResponseWriter, r *http.Request) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.renewDown {
		problem(w, 503, "unavailable")
		return
	}
	cp.renews++
	tok := fmt.Sprintf("session-%d-r%d", cp.fencing, cp.renews)
	cp.tokens[tok] = cp.fencing
	cp.expiresAt[tok] = cp.clk.Now().Add(time.Duration(cp.ttl) * time.Second)
	writeJSON(w, api.RenewResponse{SessionToken: tok, SessionExpiresAt: cp.clk.Now().Add(time.Duration(cp.ttl) * time.Second), SessionTTLSeconds: cp.ttl})
}

func (cp *fakeCP) commands(w http.ResponseWriter, r *http.Request) {
	cp.mu.Lock()
	cp.activePolls++
	defer cp.with(func() { cp.activePolls-- })
	cp.pollTimes = append(cp.pollTimes, cp.clk.Now())
	cp.pollTokens = append(cp.pollTokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	resume := r.URL.Query().Get("resume") == "true"
	cp.pollResumes = append(cp.pollResumes, resume)
	cp.pollWaits = append(cp.pollWaits, r.URL.Query().Get("wait"))
	if resume && len(cp.onResume) > 0 {
		cp.queue = append(append([]api.Command(nil), cp.onResume...), cp.queue...)
	}
	if len(cp.pollScript) > 0 {
		f := cp.pollScript[0]
		cp.pollScript = cp.pollScript[1:]
		cp.mu.Unlock()
		f(w)
		return
	}
	cp.mu.Unlock()
	// Hold briefly (real time) unless work arrives: enough to keep the agent
	// from spinning, short enough for a test.
	deadline := time.NewTimer(100 * time.Millisecond)
	defer deadline.Stop()
	for {
		cp.mu.Lock()
		if len(cp.queue) > 0 || cp.retired || cp.configUrgentLocked() {
			cmds := cp.queue
			cp.queue = nil
			retired := cp.retired
			if retired {
				cp.mu.Unlock()
				problem(w, 410, "node_retired")
				return
			}
			resp := api.CommandsResponse{Commands: cmds, Config: cp.configDueLocked()}
			cp.mu.Unlock()
			writeJSON(w, resp)
			return
		}
		cp.mu.Unlock()
		select {
		case <-cp.wake:
		case <-deadline.C:
			cp.mu.Lock()
			resp := api.CommandsResponse{Commands: []api.Command{}, Config: cp.configDueLocked()}
			cp.mu.Unlock()
			writeJSON(w, resp)
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (cp *fakeCP) dueLocked() bool {
	d, l := cp.cfgDesired, cp.cfgLast
	if d == nil {
		return false
	}
	if l == nil || l.Revision != d.Revision || l.Hash != d.Hash {
		return true
	}
	return l.State == api.ConfigFailed && cp.cfgForced
}

// configUrgentLocked: due and not delivered to this session lately, so it
// answers a held poll at once.
func (cp *fakeCP) configUrgentLocked() bool {
	return cp.dueLocked() && (cp.cfgDeliveredTo != cp.fencing || cp.clk.Now().Sub(cp.cfgDeliveredAt) >= 60*time.Second)
}

// configDueLocked answers the configuration to carry, noting the delivery.
func (cp *fakeCP) configDueLocked() *api.ConfigDelivery {
	if !cp.dueLocked() {
		return nil
	}
	cp.cfgDeliveries++
	cp.cfgDeliveredAt, cp.cfgDeliveredTo = cp.clk.Now(), cp.fencing
	d := *cp.cfgDesired
	return &d
}

// configure sets the desired configuration (doc nil clears it): a new
// revision when its hash changes, as the server stores it.
func (cp *fakeCP) configure(format string, doc any) *api.ConfigDelivery {
	raw, err := json.Marshal(doc)
	if err != nil {
		cp.t.Fatal(err)
	}
	sum := sha256.Sum256(append([]byte(format+"\x00"), raw...))
	hash := hex.EncodeToString(sum[:])
	cp.mu.Lock()
	if cp.cfgDesired == nil || cp.cfgDesired.Hash != hash {
		rev := int64(1)
		if cp.cfgDesired != nil {
			rev = cp.cfgDesired.Revision + 1
		}
		cp.cfgDesired = &api.ConfigDelivery{Revision: rev, Hash: hash, Format: format, Document: raw}
		cp.cfgForced = false
		cp.cfgDeliveredAt = time.Time{}
	}
	d := *cp.cfgDesired
	cp.mu.Unlock()
	cp.poke()
	return &d
}

// force pushes the desired configuration again after a failed report.
func (cp *fakeCP) force() {
	cp.with(func() { cp.cfgForced, cp.cfgDeliveredAt = true, time.Time{} })
	cp.poke()
}

func (cp *fakeCP) poke() {
	select {
	case cp.wake <- struct{}{}:
	default:
	}
}

// configReports lists the config reports recorded for revision rev.
func (cp *fakeCP) configReports(rev int64) []api.ConfigReport {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []api.ConfigReport
	for _, e := range cp.cfgReports {
		if e.Config.Revision == rev {
			out = append(out, *e.Config)
		}
	}
	return out
}

func (cp *fakeCP) polls() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return len(cp.pollTimes)
}

func (cp *fakeCP) resultsH(w http.ResponseWriter, r *http.Request) {
	var req api.ResultsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		problem(w, 400, "invalid_json")
		return
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out api.ResultsResponse
	for _, res := range req.Results {
		cp.results = append(cp.results, res)
		st := "applied"
		if !res.Applied {
			st = "refused"
		}
		out.Settled = append(out.Settled, api.Settled{OperationID: res.OperationID, State: st})
	}
	writeJSON(w, out)
}

func (cp *fakeCP) eventsH(w http.ResponseWriter, r *http.Request) {
	var req api.EventsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		problem(w, 400, "invalid_json")
		return
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.eventsDown > 0 {
		cp.eventsDown--
		problem(w, 503, "unavailable")
		return
	}
	var resp api.EventsResponse
	for _, e := range req.Events {
		if cp.eventIDs[e.ID] {
			resp.Duplicates++
			continue
		}
		cp.eventIDs[e.ID] = true
		cp.events = append(cp.events, e)
		resp.Recorded++
		if e.Kind == api.EventConfig {
			if e.Config == nil || e.ObservedAt.IsZero() || (e.Config.State != api.ConfigApplied && e.Config.State != api.ConfigFailed) {
				cp.t.Errorf("malformed config report: %+v", e)
				continue
			}
			cp.cfgReports = append(cp.cfgReports, e)
			r := *e.Config
			cp.cfgLast = &r
			if d := cp.cfgDesired; d != nil && r.Revision == d.Revision && r.Hash == d.Hash {
				cp.cfgForced = false
			}
		}
	}
	writeJSON(w, resp)
}

func (cp *fakeCP) outputH(w http.ResponseWriter, r *http.Request) {
	var req api.OutputRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		problem(w, 400, "invalid_json")
		return
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if cp.outputDown > 0 {
		cp.outputDown--
		problem(w, 503, "unavailable")
		return
	}
	if cp.refuseOutput {
		cp.outputRefuse = append(cp.outputRefuse, req.RunID+"/"+req.AttemptID)
		problem(w, 422, "validation_failed")
		return
	}
	cp.outputPosts++
	key := req.RunID + "/" + req.AttemptID
	_, seen := cp.outputs[key]
	if !seen {
		cp.outputs[key] = req
	}
	writeJSON(w, api.OutputResponse{Recorded: !seen})
}

func (cp *fakeCP) push(cmds ...api.Command) {
	cp.mu.Lock()
	cp.queue = append(cp.queue, cmds...)
	cp.mu.Unlock()
	select {
	case cp.wake <- struct{}{}:
	default:
	}
}

func (cp *fakeCP) script(fs ...func(http.ResponseWriter)) {
	cp.mu.Lock()
	cp.pollScript = append(cp.pollScript, fs...)
	cp.mu.Unlock()
}

func (cp *fakeCP) resultsFor(op string) []api.Result {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []api.Result
	for _, r := range cp.results {
		if r.OperationID == op {
			out = append(out, r)
		}
	}
	return out
}

func (cp *fakeCP) workloadEvents(run, attempt string) []api.WorkloadObservation {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []api.WorkloadObservation
	for _, e := range cp.events {
		if e.Kind == api.EventWorkload && e.Workload.RunID == run && e.Workload.AttemptID == attempt {
			out = append(out, *e.Workload)
		}
	}
	return out
}

func (cp *fakeCP) heartbeats() []api.Event {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []api.Event
	for _, e := range cp.events {
		if e.Kind == api.EventHeartbeat {
			out = append(out, e)
		}
	}
	return out
}

func (cp *fakeCP) with(f func()) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	f()
}
