package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/offstack"
	"github.com/nodeward/nodeward/ledger"
	"github.com/nodeward/nodeward/secrets"
)

// The agent API: enrollment, then everything on a fenced session.

func (h *handler) enroll(w http.ResponseWriter, r *http.Request) {
	var req api.EnrollRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	var v errcode.Validation
	checkDisplayable(&v, "agent_version", req.AgentVersion)
	checkFacts(&v, "facts", req.Facts)
	if err := v.Err(); err != nil {
		writeError(w, r, err)
		return
	}
	resp, err := h.Fleet.Enroll(r.Context(), req)
	if err != nil {
		if errors.Is(err, fleet.ErrEnrollmentShed) {
			// Spread the retries of a shed wave over a few seconds rather
			// than send them all back at once.
			w.Header().Set("Retry-After", strconv.Itoa(1+rand.IntN(5)))
		}
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// enrollPath is the one agent door that authenticates by its body.
const enrollPath = "/agent/v1/enroll"

type agentSessionKey struct{}

// requireAgentSession answers 401 session_invalid, before routing, decoding
// or method checks, to any agent request but enroll that carries no valid
// session credential: an anonymous caller learns nothing about the doors.
// Other refusals (fenced, retired) depend on the door and are left to it.
// A session good for every door is kept for the handler (agentSession).
// Then a path that is not plain text is 404 (plainPath).
//
// The work is in authAgent, which has returned before the handler runs: a
// held long-poll parks under this frame (see edge).
func (h *handler) requireAgentSession(next http.Handler) http.Handler {
	return &agentSessionHandler{h: h, next: next}
}

// agentSessionHandler is requireAgentSession's layer (a type of its own:
// see edgeHandler).
type agentSessionHandler struct {
	h    *handler
	next http.Handler
}

func (a *agentSessionHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var ok bool
	offstack.Run(func() { r, ok = a.h.authAgent(w, r) })
	if !ok {
		return
	}
	if !plainText(r.URL.Path) {
		a.h.notFound(w, r)
		return
	}
	a.next.ServeHTTP(w, r)
}

// authAgent is requireAgentSession's authentication: it answers the
// request to go on with, or false once it has answered the refusal.
func (h *handler) authAgent(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if r.URL.Path == enrollPath {
		return r, true
	}
	sess, err := h.Fleet.Authenticate(r.Context(), bearer(r), fleet.DoorAsk)
	switch {
	case errors.Is(err, fleet.ErrSessionInvalid):
		w.Header().Set("WWW-Authenticate", `Bearer realm="nodeward-agent"`)
		writeError(w, r, err)
		return r, false
	case err == nil:
		// DoorAsk asks the most of the node: the session holds for
		// DoorReport too.
		if ri, ok := r.Context().Value(requestIDKey).(*requestInfo); ok {
			ri.agent, ri.agentOK = sess, true
		} else {
			r = r.WithContext(context.WithValue(r.Context(), agentSessionKey{}, sess))
		}
	}
	return r, true
}

// agentSession authenticates the request's session for a door, answering
// the refusal itself when there is none.
func (h *handler) agentSession(w http.ResponseWriter, r *http.Request, door fleet.Door) (fleet.Session, bool) {
	if ri, ok := r.Context().Value(requestIDKey).(*requestInfo); ok && ri.agentOK {
		return ri.agent, true
	}
	if sess, ok := r.Context().Value(agentSessionKey{}).(fleet.Session); ok {
		return sess, true
	}
	sess, err := h.Fleet.Authenticate(r.Context(), bearer(r), door)
	if err != nil {
		if errors.Is(err, fleet.ErrSessionInvalid) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodeward-agent"`)
		}
		writeError(w, r, err)
		return fleet.Session{}, false
	}
	return sess, true
}

func (h *handler) renewSession(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		writeError(w, r, err)
		return
	}
	resp, err := h.Fleet.Renew(r.Context(), bearer(r))
	if err != nil {
		if errors.Is(err, fleet.ErrSessionInvalid) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodeward-agent"`)
		}
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// DefaultPollWait is the long-poll wait when the agent names none.
const DefaultPollWait = 25 * time.Second

// pollCommands holds the agent's long-poll. The request is read and
// authenticated, and the answer written, on a helper goroutine
// (internal/offstack) while the connection's goroutine parks in PollFor: a
// parked goroutine keeps the stack its deepest frames grew until the
// collector finds it mostly unused, so the frames under the wait are kept
// small and nothing deep runs on them (BENCHMARKS.md, memory per held
// poll). GET /agent/v1/commands reaches it past chi (pollRoute).
//
// It is routed as a pollHandler: a method value would add two frames.
func (h *handler) pollCommands(w http.ResponseWriter, r *http.Request) {
	(*pollHandler)(h).ServeHTTP(w, r)
}

// pollHandler serves GET /agent/v1/commands (pollCommands).
type pollHandler handler

func (p *pollHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := (*handler)(p)
	var (
		sess fleet.Session
		req  fleet.PollRequest
		ok   bool
	)
	offstack.Run(func() { sess, req, ok = h.pollRequest(w, r) })
	if !ok {
		return
	}
	answer, err := h.Fleet.PollFor(r.Context(), sess, req)
	offstack.Run(func() { h.answerPoll(w, r, sess, answer, err) })
}

// pollRequest authenticates a poll and reads its wait and resume flag,
// answering the refusal itself when there is one.
func (h *handler) pollRequest(w http.ResponseWriter, r *http.Request) (fleet.Session, fleet.PollRequest, bool) {
	sess, ok := h.agentSession(w, r, fleet.DoorAsk)
	if !ok {
		return fleet.Session{}, fleet.PollRequest{}, false
	}
	req := fleet.PollRequest{Wait: DefaultPollWait, Remote: r.RemoteAddr}
	q := queryOf(r)
	n, ok, err := q.number("wait", 0, int64(fleet.MaxPollWait/time.Second), "whole seconds from 0 to 60")
	if err == nil && ok {
		req.Wait = time.Duration(n) * time.Second
	}
	if err == nil {
		req.Resume, _, err = q.boolean("resume")
	}
	if err != nil {
		writeError(w, r, err)
		return fleet.Session{}, fleet.PollRequest{}, false
	}
	if h.Draining() {
		writeError(w, r, fleet.ErrDraining)
		return fleet.Session{}, fleet.PollRequest{}, false
	}
	return sess, req, true
}

// answerPoll writes what a poll found; when the node cannot have seen the
// answer, its commands and configuration are made due again.
func (h *handler) answerPoll(w http.ResponseWriter, r *http.Request, sess fleet.Session, answer fleet.PollAnswer, err error) {
	if err != nil {
		if r.Context().Err() != nil {
			return // the agent went away; nothing was claimed
		}
		writeError(w, r, err)
		return
	}
	cmds := answer.Commands
	// The configuration's sealed values are in it: it reaches only this
	// node's session.
	out := api.CommandsResponse{Commands: make([]api.Command, len(cmds)), Config: answer.Config}
	for i, c := range cmds {
		out.Commands[i] = c.Wire()
		if out.Commands[i].Payload, err = h.deliverSealed(r.Context(), c); err != nil {
			break
		}
	}
	var body []byte
	kept := len(cmds)
	if err == nil {
		body, kept, err = pollAnswerBody(out, api.MaxAnswerBytes/2)
	}
	if err == nil && kept < len(cmds) {
		// Those that did not fit go in the next answers.
		if err = h.Fleet.Unclaim(r.Context(), sess, cmds[kept:]); err == nil {
			cmds = cmds[:kept]
		}
	}
	if err != nil {
		// Not a byte of the answer was written: the node saw none of it.
		writeError(w, r, err)
		h.releasePoll(r, sess, cmds, answer.Config != nil, true)
		return
	}
	if err := writeBodyChecked(w, http.StatusOK, body); err != nil || r.Context().Err() != nil {
		h.releasePoll(r, sess, cmds, answer.Config != nil, false)
	}
}

// releasePoll makes an answer's commands and configuration due again now
// rather than after the visibility timeout. An answer that was written,
// even in part, may have reached the node: its commands keep their
// delivery (fleet.Service.Release); one never written is undone
// (fleet.Service.Unclaim).
func (h *handler) releasePoll(r *http.Request, sess fleet.Session, cmds []fleet.Command, config, unsent bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	release := h.Fleet.Release
	if unsent {
		release = h.Fleet.Unclaim
	}
	if err := release(ctx, sess, cmds); err != nil {
		logger(r).Warn("release undelivered commands", "err", err)
	}
	if config {
		if err := h.Fleet.ReleaseConfig(ctx, sess); err != nil {
			logger(r).Warn("release undelivered configuration", "err", err)
		}
	}
}

// pollAnswerBody encodes a poll's answer as encoding/json does, with as
// many of its commands, in order, as fit in commandBytes (at least one),
// and answers how many it kept. Each command's payload and the
// configuration's document are copied as they are after a check that
// they are JSON: they are the server's own canonical JSON, and
// encoding/json re-validates and compacts every json.RawMessage through
// its slow scanner, 2.6 ms for a 250 KB document against 0.2 ms for the
// check, most of the CPU of a large configuration's delivery
// (BENCHMARKS.md, thirty-ninth sitting) and of a large fan-out's
// (forty-fourth).
func pollAnswerBody(out api.CommandsResponse, commandBytes int) ([]byte, int, error) {
	answer := append(make([]byte, 0, 512), `{"commands":[`...)
	kept := 0
	for _, c := range out.Commands {
		payload := c.Payload
		c.Payload = nil
		enc, err := encodeRawLast(c, payload, "a command's payload")
		if err != nil {
			return nil, 0, err
		}
		if kept > 0 && len(answer)+len(enc) > commandBytes {
			break
		}
		if kept > 0 {
			answer = append(answer, ',')
		}
		answer = append(answer, enc...)
		kept++
	}
	answer = append(answer, ']')
	if cfg := out.Config; cfg != nil {
		head := *cfg
		head.Document = nil
		enc, err := encodeRawLast(head, cfg.Document, "the configuration document")
		if err != nil {
			return nil, 0, err
		}
		answer = append(answer, `,"config":`...)
		answer = append(answer, enc...)
	}
	return append(answer, '}'), kept, nil
}

// encodeRawLast encodes head, a struct whose last field is a nil
// json.RawMessage, with raw (what names it in an error) in that field's
// place: nil is JSON null, anything else must be JSON.
func encodeRawLast(head any, raw json.RawMessage, what string) ([]byte, error) {
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	if !jsontext.Value(raw).IsValid() {
		return nil, fmt.Errorf("handlers: %s to deliver is not JSON", what)
	}
	enc, err := json.Marshal(head)
	if err != nil {
		return nil, err
	}
	enc, ok := bytes.CutSuffix(enc, []byte(`null}`))
	if !ok {
		return nil, fmt.Errorf("handlers: the encoding around %s is not the shape expected", what)
	}
	enc = append(enc, raw...)
	return append(enc, '}'), nil
}

func (h *handler) postResults(w http.ResponseWriter, r *http.Request) {
	sess, ok := h.agentSession(w, r, fleet.DoorReport)
	if !ok {
		return
	}
	var req api.ResultsRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	if req.Results == nil {
		var v errcode.Validation
		v.Add("results", "required: an array of results (empty is allowed)")
		writeError(w, r, v.Err())
		return
	}
	settled, err := h.Fleet.Settle(r.Context(), sess, req.Results)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ResultsResponse{Settled: settled})
}

func (h *handler) postEvents(w http.ResponseWriter, r *http.Request) {
	sess, ok := h.agentSession(w, r, fleet.DoorReport)
	if !ok {
		return
	}
	var req api.EventsRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, err)
		return
	}
	var v errcode.Validation
	v.Check(req.Events != nil, "events", "required: an array of events (empty is allowed)")
	for i, e := range req.Events {
		if e.Facts != nil {
			checkFacts(&v, fmt.Sprintf("events/%d/facts", i), *e.Facts)
		}
	}
	if err := v.Err(); err != nil {
		writeError(w, r, err)
		return
	}
	res, err := h.Fleet.RecordEvents(r.Context(), sess, req.Events)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.EventsResponse{Recorded: res.Recorded, Duplicates: res.Duplicates})
}

// deliverSealed answers the command's payload with the sealed values its
// operation resolved, decrypted into this answer only: the command as
// stored (and as administrators read it) keeps the handles. A fan-out
// child delivers what its parent resolved.
func (h *handler) deliverSealed(ctx context.Context, c fleet.Command) (json.RawMessage, error) {
	if h.Secrets == nil || !secrets.Carries(c.Payload) {
		return c.Payload, nil
	}
	op, err := h.Ledger.Get(ctx, ledger.Principal{Kind: ledger.PrincipalAdmin}, c.OperationID)
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return nil, err
	}
	if op.ParentID != "" {
		return h.Secrets.Deliver(ctx, op.ParentID, "/payload", c.Payload)
	}
	return h.Secrets.Deliver(ctx, c.OperationID, "", c.Payload)
}
