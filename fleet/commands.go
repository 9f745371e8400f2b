package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/errcode"
	"github.com/nodeward/nodeward/internal/offstack"
	"github.com/nodeward/nodeward/secrets"
)

// IssueCommand is a request to record a command for a node.
type IssueCommand struct {
	NodeID      string
	OperationID string
	Kind        string
	Payload     json.RawMessage
}

// The payload checks refuse at submit what the agent would refuse at the
// node (agent/runtime checks the same again): a refusal here records
// nothing and names the field, one from the node spends a launch's id.
var commandKinds = map[string]func(json.RawMessage, *errcode.Validation){
	api.KindPrepareImage: func(p json.RawMessage, v *errcode.Validation) {
		var x struct {
			api.PrepareImage
			ArtifactID *string `json:"artifact_id"` // present and empty is refused
		}
		if strictPayload(p, &x, v) {
			v.Check(imageName.MatchString(x.Image), "payload/image", "required: 1-512 printable ASCII characters, no spaces")
			v.Check(x.ArtifactID == nil || idPattern.MatchString(*x.ArtifactID), "payload/artifact_id", idRule)
		}
	},
	api.KindPrepareArtifact: func(p json.RawMessage, v *errcode.Validation) {
		var x api.PrepareArtifact
		if strictPayload(p, &x, v) {
			v.Check(idPattern.MatchString(x.ArtifactID), "payload/artifact_id", "required: "+idRule)
			v.Check(strings.HasPrefix(x.URL, "http://") || strings.HasPrefix(x.URL, "https://"), "payload/url", "required: an http(s) URL")
			v.Check(len(x.SHA256) == 64 && isHex(x.SHA256), "payload/sha256", "required: 64 hex characters")
		}
	},
	api.KindLaunchWorkload: func(p json.RawMessage, v *errcode.Validation) {
		var x api.LaunchWorkload
		if strictPayload(p, &x, v) {
			v.Check(idPattern.MatchString(x.RunID), "payload/run_id", "required: "+idRule)
			v.Check(idPattern.MatchString(x.AttemptID), "payload/attempt_id", "required: "+idRule)
			v.Check(x.Image == "" || imageName.MatchString(x.Image), "payload/image", "1-512 printable ASCII characters, no spaces")
			v.Check(x.Command != "", "payload/command", "required")
			for _, name := range slices.Sorted(maps.Keys(x.Env)) {
				v.Check(name != "" && !strings.ContainsAny(name, "=\x00"), "payload/env", "variable names are not empty and hold no '=': %q", name)
			}
			for i, vol := range x.CacheVolumes {
				v.Check(idPattern.MatchString(vol), fmt.Sprintf("payload/cache_volumes/%d", i), idRule)
			}
		}
	},
	api.KindStopWorkload: func(p json.RawMessage, v *errcode.Validation) {
		var x struct {
			api.StopWorkload
			GraceSeconds *int `json:"grace_seconds"`
		}
		if strictPayload(p, &x, v) {
			v.Check(idPattern.MatchString(x.RunID), "payload/run_id", "required: "+idRule)
			v.Check(idPattern.MatchString(x.AttemptID), "payload/attempt_id", "required: "+idRule)
			v.Check(x.GraceSeconds != nil && *x.GraceSeconds >= 0 && *x.GraceSeconds <= 3600, "payload/grace_seconds", "required: 0 to 3600")
		}
	},
}

const idRule = "1-128 characters of letters, digits, '.', '_', ':' or '-', starting with a letter or digit"

// imageName is what an image may be called: the agent keeps it in its
// records and logs, and refuses longer names.
var imageName = regexp.MustCompile(`^[!-~]{1,512}$`)

// CommandKindNames answers the command kinds Issue accepts, sorted.
func CommandKindNames() []string {
	out := make([]string, 0, len(commandKinds))
	for k := range commandKinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

func strictPayload(p json.RawMessage, out any, v *errcode.Validation) bool {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		v.Add("payload", "does not match the kind's payload: %s", strings.TrimPrefix(err.Error(), "json: "))
		return false
	}
	return true
}

// canonicalPayload re-encodes the payload (compact, keys sorted, numbers
// as written) so the same command issued twice has the same digest
// whatever its formatting.
func canonicalPayload(p json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func commandDigest(kind string, payload json.RawMessage) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(payload)
	return hex.EncodeToString(h.Sum(nil))
}

// Issue records a command durably, before any delivery, with the node's
// fencing token and issue time, and wakes the node's long-poll. Idempotent
// by operation id: the same command again answers the existing record
// (created false); a refused prepare_* command is issued anew (preparing
// leaves no effect); a refused launch or stop keeps its id spent. Errors:
// validation_failed, ErrNotFound, ErrNodeRetired, ErrNodeNotReady,
// ErrOperationConflict.
func (s *Service) Issue(ctx context.Context, actor string, in IssueCommand) (Command, bool, error) {
	now := s.clock()
	payload, dg, err := validateIssue(in)
	if err != nil {
		return Command{}, false, err
	}
	var out Command
	created := false
	// Routed to the node's write lane (TxRoute): it locks that node's rows.
	err = s.store.Tx(OnNode(ctx, in.NodeID), func(tx Tx) error {
		var err error
		out, created, err = issueTx(ctx, tx, actor, in, payload, dg, now)
		return err
	})
	if err != nil {
		return Command{}, false, err
	}
	if created {
		s.metrics.CommandsIssued.Inc()
	}
	return out, created, nil
}

// validateIssue checks a command request (the envelope first, then the
// kind's payload) and answers its canonical payload and digest.
func validateIssue(in IssueCommand) (json.RawMessage, string, error) {
	if err := checkIssue(in); err != nil {
		return nil, "", err
	}
	payload, err := canonicalPayload(in.Payload)
	if err != nil {
		return nil, "", errPayloadJSON()
	}
	return payload, commandDigest(in.Kind, payload), nil
}

// manyValidations validates a release's commands, each distinct kind and
// payload once: a fan-out's children carry one payload, up to 256 KiB, and
// decoding and re-encoding it for each of 10,000 nodes was most of a
// release's time. Only the operation id differs between them, so a child
// whose id passes shares the answer of the first such child; a child
// whose id fails is validated whole, for the same combined error.
type manyValidations map[string]validated

type validated struct {
	kind    string
	payload json.RawMessage
	digest  string
	err     error
}

func (m *manyValidations) validate(in IssueCommand) (json.RawMessage, string, error) {
	if !idPattern.MatchString(in.OperationID) {
		return validateIssue(in)
	}
	if got, ok := (*m)[string(in.Payload)]; ok && got.kind == in.Kind {
		return got.payload, got.digest, got.err
	}
	payload, digest, err := validateIssue(in)
	if *m == nil {
		*m = manyValidations{}
	}
	(*m)[string(in.Payload)] = validated{kind: in.Kind, payload: payload, digest: digest, err: err}
	return payload, digest, err
}

func errPayloadJSON() error {
	return errcode.New(errcode.ValidationFailed, "payload is not valid JSON")
}

// checkIssue is validateIssue's checks, the envelope then the kind's
// payload, short of its canonical payload.
func checkIssue(in IssueCommand) error {
	var v errcode.Validation
	v.Check(idPattern.MatchString(in.OperationID), "operation_id", "required: 1-128 characters of letters, digits, '.', '_', ':' or '-'")
	check, known := commandKinds[in.Kind]
	v.Check(known, "kind", "one of prepare_image, prepare_artifact, launch_workload, stop_workload, diagnose")
	v.Check(len(in.Payload) <= MaxPayloadBytes, "payload", "at most 256 KiB")
	trimmed := bytes.TrimSpace(in.Payload)
	v.Check(len(trimmed) > 0 && trimmed[0] == '{', "payload", "required: a JSON object")
	if err := v.Err(); err != nil {
		return err
	}
	check(in.Payload, &v)
	return v.Err()
}

// issueTx is Issue's transaction: the operation id's earlier use decides
// first (same command: its record; different: a conflict), then the node
// must be ready, then the command is written, audited and announced. It
// answers the command and whether this call wrote it.
func issueTx(ctx context.Context, tx Tx, actor string, in IssueCommand, payload json.RawMessage, dg string, now time.Time) (Command, bool, error) {
	existing, done, err := priorIssue(ctx, tx, in, dg)
	if err != nil || done {
		return existing, false, err
	}
	n, err := lockReadyNode(ctx, tx, in.NodeID)
	if err != nil {
		return Command{}, false, err
	}
	if err := nodeCapable(n, in.Kind); err != nil {
		return Command{}, false, err
	}
	out := Command{OperationID: in.OperationID, NodeID: n.ID, Kind: in.Kind, Payload: payload, PayloadDigest: dg,
		FencingToken: n.FencingToken, IssuedAt: now, State: CommandPending}
	action := "command.issue"
	if existing.OperationID != "" {
		// A refused prepare_* asked again: same identity, fresh delivery.
		action = "command.reissue"
		if err := tx.UpdateCommand(ctx, out); err != nil {
			return Command{}, false, err
		}
	} else if err := tx.InsertCommand(ctx, out); err != nil {
		if errors.Is(err, ErrDuplicate) {
			return Command{}, false, ErrOperationConflict
		}
		return Command{}, false, err
	}
	if err := tx.AppendAudit(ctx, AuditEntry{At: now, Actor: actor, Action: action, NodeID: n.ID,
		Detail: map[string]any{"operation_id": out.OperationID, "kind": out.Kind, "fencing_token": out.FencingToken}}); err != nil {
		return Command{}, false, err
	}
	if err := tx.Notify(ctx, Notification{Kind: NotifyIssued, NodeID: n.ID}); err != nil {
		return Command{}, false, err
	}
	return out, true, nil
}

// priorIssue looks up the operation id's earlier use, locked. It answers
// done with the existing record when that settles the call (the same
// command again), ErrOperationConflict for a different command under the
// id, and the existing record with done false when a refused prepare_*
// may be issued anew. An unused id answers a zero Command.
func priorIssue(ctx context.Context, tx Tx, in IssueCommand, dg string) (existing Command, done bool, err error) {
	existing, err = tx.LockCommand(ctx, in.OperationID)
	if isNoRows(err) {
		return Command{}, false, nil
	}
	if err != nil {
		return Command{}, false, err
	}
	if existing.NodeID != in.NodeID || existing.PayloadDigest != dg {
		return Command{}, false, ErrOperationConflict
	}
	if existing.State != CommandRefused || !LeavesNoEffectOnFailure(existing.Kind) {
		return existing, true, nil
	}
	return existing, false, nil
}

// lockReadyNode answers the node locked, refusing one that is absent,
// retired or not ready: work is sent only to ready nodes.
func lockReadyNode(ctx context.Context, tx Tx, nodeID string) (Node, error) {
	n, err := tx.LockNode(ctx, nodeID)
	if isNoRows(err) {
		return Node{}, ErrNotFound
	}
	if err != nil {
		return Node{}, err
	}
	return n, readyForWork(n)
}

// readyForWork refuses a node that is retired or not ready.
func readyForWork(n Node) error {
	switch n.State {
	case StateRetired:
		return ErrNodeRetired
	case StateReady:
		return nil
	default:
		return errcode.Errorf(errcode.NodeNotReady, "node is %s; work is sent only to ready nodes", n.State)
	}
}

// ValidateCommand checks a command's kind and payload (validation_failed).
func ValidateCommand(kind string, payload json.RawMessage) error {
	if err := checkIssue(IssueCommand{OperationID: "validate", Kind: kind, Payload: payload}); err != nil {
		return err
	}
	// What canonicalPayload refuses, without building the canonical form
	// (the ledger's submit validates, then issues, which builds it): the
	// same decoder's syntax errors, the only ones decoding into any has.
	var raw json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&raw); err != nil {
		return errPayloadJSON()
	}
	return nil
}

// CheckIssue refuses, without writing anything, a command IssueTx would
// refuse now: validation_failed, ErrNotFound, ErrNodeRetired,
// node_not_ready.
func (s *Service) CheckIssue(ctx context.Context, in IssueCommand) error {
	if _, _, err := validateIssue(in); err != nil {
		return err
	}
	n, err := s.Node(ctx, in.NodeID)
	if err != nil {
		return err
	}
	if err := readyForWork(n); err != nil {
		return err
	}
	return nodeCapable(n, in.Kind)
}

// PreparedIssue is a command built before the transaction that records
// it (PrepareIssue), with the held poll it is to be handed to, if any.
type PreparedIssue struct {
	// Command is what IssueTx records: delivered to the poll's fencing
	// token when a poll is to take it, else pending.
	Command Command
	h       *handoff
}

// PrepareIssue builds in's command as IssueTx would inside its
// transaction (validation_failed when it is not valid), so that a submit
// can describe its write to the store before its transaction runs
// (WithPreparedIssue): the store may then record it in one statement with
// other submits'. A poll this replica holds for a quiet node is to be
// handed the command: it is recorded delivered to that poll, when the node
// still has the poll's fencing token under the lock (handoff.go).
func (s *Service) PrepareIssue(in IssueCommand) (*PreparedIssue, error) {
	payload, dg, err := validateIssue(in)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	c := Command{OperationID: in.OperationID, NodeID: in.NodeID, Kind: in.Kind, Payload: payload, PayloadDigest: dg,
		IssuedAt: now, State: CommandPending}
	h := s.pollToHand(in.NodeID)
	if h != nil {
		fencing := h.fencing
		c.DeliveredFencing, c.FirstDeliveredAt, c.LastDeliveredAt, c.DeliveryCount = &fencing, &now, &now, 1
	}
	return &PreparedIssue{Command: c, h: h}, nil
}

type preparedIssueKey struct{}

// WithPreparedIssue has IssueTx, run with the context it answers, record
// p when asked to issue p's command: the same command, time and hand-off
// however often the transaction runs.
func WithPreparedIssue(ctx context.Context, p *PreparedIssue) context.Context {
	return context.WithValue(ctx, preparedIssueKey{}, p)
}

// preparedIssue answers ctx's prepared issue of in, else prepares one.
func (s *Service) preparedIssue(ctx context.Context, in IssueCommand) (*PreparedIssue, error) {
	p, _ := ctx.Value(preparedIssueKey{}).(*PreparedIssue)
	if p != nil && p.Command.OperationID == in.OperationID && p.Command.NodeID == in.NodeID && p.Command.Kind == in.Kind {
		return p, nil
	}
	return s.PrepareIssue(in)
}

// IssueTx records a new command inside a transaction the caller owns: the
// ledger's, which records the command's operation beside it under the same
// id (and so keeps who asked; no node audit row is written). The command is
// ctx's prepared one (WithPreparedIssue), else built now. Errors: those
// of CheckIssue, ErrOperationConflict when the id exists.
func (s *Service) IssueTx(ctx context.Context, tx Tx, in IssueCommand) (Command, error) {
	p, err := s.preparedIssue(ctx, in)
	if err != nil {
		return Command{}, err
	}
	c, h := p.Command, p.h
	// The node is locked and the command recorded in one statement, only
	// if the node is ready; a refusal below (capability) is rolled back
	// with the caller's transaction, as every refusal of IssueTx is.
	n, inserted, err := tx.IssueToNode(ctx, c)
	switch {
	case isNoRows(err):
		return Command{}, ErrNotFound
	case errors.Is(err, ErrDuplicate):
		return Command{}, ErrOperationConflict
	case err != nil:
		return Command{}, err
	}
	if err := readyForWork(n); err != nil {
		return Command{}, err
	}
	if !inserted {
		return Command{}, fmt.Errorf("command %s not recorded for ready node %s", c.OperationID, n.ID)
	}
	if err := nodeCapable(n, in.Kind); err != nil {
		return Command{}, err
	}
	c.NodeID, c.FencingToken = n.ID, n.FencingToken
	s.metrics.CommandsIssued.Inc()
	if h == nil || h.fencing != n.FencingToken {
		// Recorded pending (the node re-enrolled since the poll came):
		// IssueToNode notified the node's polls.
		c.DeliveredFencing, c.FirstDeliveredAt, c.LastDeliveredAt, c.DeliveryCount = nil, nil, nil, 0
		return c, nil
	}
	h.cmds = []Command{c}
	return c, tx.Notify(ctx, Notification{Kind: NotifyHanded, NodeID: n.ID, handoff: h})
}

// IssueManyTx records many commands (a fan-out's release) inside the
// caller's transaction in a few statements whatever their number: the
// nodes locked in id order in one, the commands inserted in one. admit
// runs under the nodes' locks with the indexes that passed the node's own
// checks and may refuse more (the ledger's node quota, counted in one
// statement). It answers, per input, the refusal that left it unrecorded
// (nil: recorded) — the errors IssueTx would answer for it alone.
func (s *Service) IssueManyTx(ctx context.Context, tx Tx, ins []IssueCommand, admit func(ok []int) (map[int]error, error)) ([]error, error) {
	refused := make([]error, len(ins))
	payloads := make([]json.RawMessage, len(ins))
	digests := make([]string, len(ins))
	var v manyValidations
	for i, in := range ins {
		payloads[i], digests[i], refused[i] = v.validate(in)
	}
	nodes, ok, err := lockForMany(ctx, tx, refused, func(i int) string { return ins[i].NodeID }, func(i int, n Node) error {
		if err := readyForWork(n); err != nil {
			return err
		}
		return nodeCapable(n, ins[i].Kind)
	})
	if err != nil || len(ok) == 0 {
		return refused, err
	}
	more, err := admit(ok)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	var cs []Command
	for _, i := range ok {
		if e := more[i]; e != nil {
			refused[i] = e
			continue
		}
		n := nodes[ins[i].NodeID]
		cs = append(cs, Command{OperationID: ins[i].OperationID, NodeID: n.ID, Kind: ins[i].Kind, Payload: payloads[i],
			PayloadDigest: digests[i], FencingToken: n.FencingToken, IssuedAt: now, State: CommandPending})
	}
	handed := s.handToHeldPolls(cs, now)
	if err := tx.InsertCommands(ctx, cs); err != nil {
		if errors.Is(err, ErrDuplicate) {
			return nil, ErrOperationConflict
		}
		return nil, err
	}
	s.metrics.CommandsIssued.Add(float64(len(cs)))
	for i, c := range cs {
		if err := tx.Notify(ctx, Notification{Kind: NotifyIssued, NodeID: c.NodeID}); err != nil {
			return nil, err
		}
		if h := handed[i]; h != nil {
			if err := tx.Notify(ctx, Notification{Kind: NotifyHanded, NodeID: c.NodeID, handoff: h}); err != nil {
				return nil, err
			}
		}
	}
	return refused, nil
}

// lockForMany locks, in one statement, the nodes of the requests of a
// batch not yet refused (nodeOf names each one's node) and refuses those
// whose node is absent (ErrNotFound) or fails check. It answers the nodes
// and the indexes that passed.
func lockForMany(ctx context.Context, tx Tx, refused []error, nodeOf func(i int) string,
	check func(i int, n Node) error) (map[string]Node, []int, error) {
	var ids []string
	for i := range refused {
		if refused[i] == nil {
			ids = append(ids, nodeOf(i))
		}
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	nodes, err := tx.LockNodes(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	var ok []int
	for i := range refused {
		if refused[i] != nil {
			continue
		}
		if n, found := nodes[nodeOf(i)]; !found {
			refused[i] = ErrNotFound
		} else {
			refused[i] = check(i, n)
		}
		if refused[i] == nil {
			ok = append(ok, i)
		}
	}
	return nodes, ok, nil
}

// Command answers one command. Errors: ErrCommandNotFound.
func (s *Service) Command(ctx context.Context, operationID string) (Command, error) {
	c, err := s.store.Command(ctx, operationID)
	if isNoRows(err) {
		return Command{}, ErrCommandNotFound
	}
	return c, err
}

// Commands answers a node's commands, oldest first (the order they are
// delivered in). Errors: ErrNotFound.
func (s *Service) Commands(ctx context.Context, nodeID string, state CommandState, limit int) ([]Command, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return nil, err
	}
	return s.store.Commands(ctx, nodeID, state, limit)
}

// CommandKey is a command's place in its node's history: a page's cursor.
type CommandKey struct {
	IssuedAt    time.Time
	OperationID string
}

// CommandHistory answers a page of a node's commands, newest first: those
// issued before the key of the previous page's last (nil: from the
// newest), at most limit. Errors: ErrNotFound.
func (s *Service) CommandHistory(ctx context.Context, nodeID string, state CommandState, before *CommandKey, limit int) ([]Command, error) {
	if _, err := s.Node(ctx, nodeID); err != nil {
		return nil, err
	}
	return s.store.CommandHistory(ctx, nodeID, state, before, limit)
}

// MaxPollWait is the longest a long-poll may be held.
const MaxPollWait = 60 * time.Second

// Poll answers the session's due commands as soon as there are any, else an
// empty list when wait ends (PollWork, less the configuration).
func (s *Service) Poll(ctx context.Context, sess Session, wait time.Duration, remote string) ([]Command, error) {
	a, err := s.PollWork(ctx, sess, wait, remote)
	return a.Commands, err
}

// PollRequest is what an agent asks of one long-poll.
type PollRequest struct {
	Wait   time.Duration
	Remote string
	// Resume says the agent may have lost an earlier answer (its last poll
	// failed, or it has just started): what was delivered to this session's
	// fencing token before the poll arrived and is still unsettled is due
	// at once rather than after the visibility timeout, and so is the
	// configuration. A restarted replica's agents come back within seconds;
	// without it a command whose answer died with the process waited 60 s
	// (DECISIONS.md §2). The agent answers a redelivery from its journal
	// (done: a duplicate result; still running: nothing yet), as it does
	// after the timeout, so only this node's own work is sent again.
	Resume bool
}

// PollAnswer is what a long-poll answers: due commands, and the desired
// configuration while it is due (nil otherwise).
type PollAnswer struct {
	Commands []Command
	Config   *api.ConfigDelivery
}

// PollWork answers the session's due commands, and its configuration
// while due, as soon as a command is due or a configuration not delivered
// to this fencing token within the visibility timeout is; else what is due
// (a configuration riding along, or nothing) when wait ends. It holds one
// store query per check: one on arrival and one per wake-up, none per
// second of waiting (the configuration costs a read only when one is due).
// A held poll counts as the node's liveness. Errors: ErrFenced,
// ErrNodeRetired (also when the node is retired while waiting),
// ErrDraining, ctx's error.
//
// The poll spends nearly all its life parked on its waiter's channel, and
// a parked goroutine keeps the stack it grew to until the collector finds
// it uses less than a quarter of it (less 800 B; then halves it). So the
// frames under the wait are kept small — one channel receive (the deadline,
// the fallback and the context's end are sent to it, rather than selected
// on) — and everything else (the hub, the timers, the store queries, the
// answer) runs on a helper goroutine (internal/offstack), so the caller's
// stack never grows past its own frames. That keeps a held poll on a 4 KB
// stack from the moment it parks (BENCHMARKS.md, memory per held poll).
func (s *Service) PollWork(ctx context.Context, sess Session, wait time.Duration, remote string) (PollAnswer, error) {
	return s.PollFor(ctx, sess, PollRequest{Wait: wait, Remote: remote})
}

// PollFor is PollWork for a PollRequest: with Resume, work delivered to the
// session before the poll arrived is due again at once (PollRequest).
func (s *Service) PollFor(ctx context.Context, sess Session, req PollRequest) (PollAnswer, error) {
	var (
		out    pollStep
		w      *waiter
		timers pollTimers
		done   bool
		err    error
	)
	// Everything but the wait itself — the hub, the timers, the checks (a
	// store query each) and the answer — runs off this goroutine's stack,
	// which the wait then keeps (offstack).
	offstack.Run(func() {
		if w, err = s.pollStart(ctx, sess, req, &out, &timers); err == nil {
			done = s.pollNext(ctx, sess, req.Wait, &out, w, &timers, 0)
		}
	})
	if err != nil {
		return PollAnswer{}, err
	}
	defer offstack.Run(func() { s.endPoll(w, &timers) })
	for !done {
		why := <-w.ch
		offstack.Run(func() { done = s.pollNext(ctx, sess, req.Wait, &out, w, &timers, why) })
	}
	if late := w.finish(); len(late) > 0 {
		offstack.Run(func() { s.answerLate(ctx, sess, &out, late) })
	}
	return out.answer, out.err
}

// answerLate adds to a poll's answer the commands handed to it while it
// was answering otherwise (its deadline, another claim); an answer that
// is an error, or full, makes them due again instead.
func (s *Service) answerLate(ctx context.Context, sess Session, out *pollStep, late []Command) {
	// The poll's own claim may have taken one of them too (a resuming
	// poll's arrival in the clock's same tick as the hand-off's claim).
	late = slices.DeleteFunc(late, func(c Command) bool {
		return slices.ContainsFunc(out.answer.Commands, func(a Command) bool { return a.OperationID == c.OperationID })
	})
	room := s.settings.MaxPollBatch - len(out.answer.Commands)
	if out.err != nil {
		room = 0
	}
	room = max(0, min(room, len(late)))
	out.answer.Commands = append(out.answer.Commands, late[:room]...)
	if rest := late[room:]; len(rest) > 0 {
		if err := s.Unclaim(context.WithoutCancel(ctx), sess, rest); err != nil {
			s.log.Warn("release commands handed to a poll that had answered", "err", err)
		}
	}
}

// pollStart registers a poll's waiter, asks for its lease's renewal and
// arms its deadline and end.
func (s *Service) pollStart(ctx context.Context, sess Session, req PollRequest, out *pollStep, timers *pollTimers) (*waiter, error) {
	if req.Resume {
		// Fixed at arrival: a delivery this poll's own wait overlaps (another
		// connection of the node's, say) was not lost, so is not resent —
		// nor one handed to this very poll, which the hub offers it only
		// from here on (subscribe).
		out.resumeAt = s.clock()
		s.metrics.PollResumes.Inc()
	}
	w, err := s.hub.subscribe(sess, req.Remote)
	if err != nil {
		return nil, err
	}
	if s.leases.touch(sess.NodeID, req.Wait) {
		s.metrics.PollRenewals.Inc()
	}
	if req.Wait > 0 {
		timers.arm(ctx, w, req.Wait)
	}
	return w, nil
}

// pollNext handles a wake-up (none on arrival), then looks again; it
// reports whether the poll is answered, else arms what it waits for.
func (s *Service) pollNext(ctx context.Context, sess Session, wait time.Duration, out *pollStep, w *waiter, t *pollTimers, why wake) bool {
	if why == wakeHanded {
		// Recorded delivered to this poll by the transaction that
		// recorded them (pollToHand): answered as a claim's would be.
		if cmds := w.take(); len(cmds) > 0 {
			out.answer, out.err = PollAnswer{Commands: cmds}, nil
			return true
		}
	}
	if why != 0 && s.pollWoken(ctx, sess, why, out) {
		return true
	}
	if s.pollCheck(ctx, sess, wait, out, why == wakeIssued) {
		return true
	}
	s.armPoll(out, w, t)
	return false
}

// pollTimers are what a waiting poll armed to be woken by.
type pollTimers struct {
	deadline, fallback *time.Timer
	stopGone           func() bool
}

// arm arms the poll's deadline and its context's end.
func (t *pollTimers) arm(ctx context.Context, w *waiter, wait time.Duration) {
	t.deadline = time.AfterFunc(wait, func() { send(w, wakeDeadline) })
	t.stopGone = context.AfterFunc(ctx, func() { send(w, wakeGone) })
}

// armPoll arms the fallback look when the notifier is down.
func (s *Service) armPoll(out *pollStep, w *waiter, t *pollTimers) {
	switch {
	case !out.fallback:
		if t.fallback != nil {
			t.fallback.Stop()
		}
	case t.fallback == nil:
		t.fallback = time.AfterFunc(s.settings.FallbackPoll, func() { send(w, wakeFallback) })
	default:
		t.fallback.Reset(s.settings.FallbackPoll)
	}
}

// endPoll stops a poll's timers and forgets its waiter.
func (s *Service) endPoll(w *waiter, t *pollTimers) {
	if t.deadline != nil {
		t.deadline.Stop()
		t.stopGone()
	}
	if t.fallback != nil {
		t.fallback.Stop()
	}
	s.hub.unsubscribe(w)
}

// pollStep is what one check of a long-poll decided.
type pollStep struct {
	answer   PollAnswer
	err      error
	rides    bool // a due configuration rides along with the answer at the deadline
	fallback bool // the notifier is down: look again after FallbackPoll
	// resumeAt, when set, is a resuming poll's arrival: deliveries to the
	// session before it are due again.
	resumeAt time.Time
}

// pollCheck claims what is due and reports whether the poll is answered
// (out.answer, out.err); else it says how to wait. issued: the poll was
// woken by a command this replica just recorded for the node.
func (s *Service) pollCheck(ctx context.Context, sess Session, wait time.Duration, out *pollStep, issued bool) bool {
	work, cmds, err := s.claim(ctx, sess, out.resumeAt, wait > 0, issued)
	if err != nil {
		out.answer, out.err = PollAnswer{}, err
		return true
	}
	if len(cmds) > 0 || work.Config == ConfigWakes || (wait <= 0 && work.Config == ConfigRides) {
		out.answer, out.err = s.answer(ctx, sess, cmds, work.Config != ConfigNotDue)
		return true
	}
	if wait <= 0 {
		out.answer, out.err = PollAnswer{}, nil
		return true
	}
	out.rides = work.Config == ConfigRides
	out.fallback = !s.notifierOK()
	return false
}

// pollWoken handles a wake-up and reports whether it answered the poll
// (out): its end, its deadline, a drain, a changed node record (fenced,
// retired); otherwise the poll looks again.
func (s *Service) pollWoken(ctx context.Context, sess Session, why wake, out *pollStep) bool {
	switch why {
	case wakeGone:
		out.answer, out.err = PollAnswer{}, ctx.Err()
		return true
	case wakeDeadline:
		out.answer, out.err = s.answer(ctx, sess, nil, out.rides)
		return true
	case wakeFallback:
		s.metrics.Wakeups.WithLabelValues("poll").Inc()
	case wakeDrain:
		out.answer, out.err = PollAnswer{}, ErrDraining
		return true
	case wakeRecheck:
		cur, err := s.currentNode(ctx, sess.NodeID)
		if err == nil && cur.fencing != sess.Fencing {
			err = ErrFenced
		}
		if err == nil && cur.retired {
			err = ErrNodeRetired
		}
		if err != nil {
			out.answer, out.err = PollAnswer{}, err
			return true
		}
	}
	return false
}

// answer adds the configuration, when one may be due, to claimed commands.
// Should the configuration's read fail, the commands are released.
func (s *Service) answer(ctx context.Context, sess Session, cmds []Command, config bool) (PollAnswer, error) {
	out := PollAnswer{Commands: cmds}
	if !config {
		return out, nil
	}
	var err error
	if out.Config, err = s.deliverConfig(ctx, sess, len(cmds) == 0); err != nil {
		if rerr := s.Unclaim(context.WithoutCancel(ctx), sess, cmds); rerr != nil {
			s.log.Warn("release undelivered commands", "err", rerr)
		}
		return PollAnswer{}, err
	}
	return out, nil
}

// claim marks the session's due commands delivered and answers them, with
// how a due configuration bears on the poll. Most polls find nothing due:
// a plain read finds that out without a write transaction, so an idle fleet
// takes no write lock. A resuming poll (resumeAt set: its arrival) takes
// what was delivered before it as due, commands and configuration alike
// (the store judges both against RedeliverBefore). Unsettled commands
// delivered under an older fencing token are not among them: enrollment
// made them due again or ended them (DECISIONS.md §1).
//
// A held poll (mayWait) whose node this replica knows to be quiet skips the
// read (dueMemo): anything written since would have been announced, and
// the announcement wakes the poll, which then reads. A poll that does not
// wait always reads — it has no wake-up to be answered by. A resuming one
// skips it too: quiet is no pending command at all, delivered or not, and
// a configuration settled by this fencing token's report, so there is
// nothing its arrival could make due again (a restarted replica's fleet
// resumes all at once). A poll woken by a
// command this replica just recorded (issued) skips the read the other
// way: it claims at once, and the claim answers what the read would have.
func (s *Service) claim(ctx context.Context, sess Session, resumeAt time.Time, mayWait, issued bool) (DueWork, []Command, error) {
	now := s.clock()
	before := now.Add(-s.settings.VisibilityTimeout)
	if resumeAt.After(before) {
		before = resumeAt
	}
	due := Due{NodeID: sess.NodeID, Fencing: sess.Fencing,
		RedeliverBefore: before, Now: now, Limit: s.settings.MaxPollBatch}
	issued = issued && resumeAt.IsZero()
	if mayWait && !issued && (s.quiet.quiet(sess.NodeID, sess.Fencing) ||
		awaitWarm(ctx, s.quiet.memo) && s.quiet.quiet(sess.NodeID, sess.Fencing)) {
		s.metrics.PollReadsSkipped.Inc()
		return DueWork{}, nil, nil
	}
	token := s.quiet.begin(sess.NodeID)
	if issued {
		s.metrics.PollDirectClaims.Inc()
	} else {
		work, err := s.store.DueWork(ctx, due)
		s.metrics.PollStoreQueries.Inc() // counted once answered
		if err != nil || !work.Commands {
			s.quiet.put(sess.NodeID, token, sess.Fencing, err == nil && work.quiet(), err == nil && work.awaiting())
			return work, nil, err
		}
	}
	// The node's capabilities come from the cache the session door just
	// filled: a node that lacks one a command needs has those commands
	// ended capability_missing instead of delivered (capabilities.go).
	cur, err := s.currentNode(ctx, sess.NodeID)
	if err != nil {
		s.quiet.put(sess.NodeID, token, sess.Fencing, false, false)
		return DueWork{}, nil, err
	}
	var work DueWork
	var cmds []Command
	err = s.store.Tx(OnNode(ctx, sess.NodeID), func(tx Tx) error {
		if err := refuseUncapable(ctx, tx, sess.NodeID, cur, now); err != nil {
			return err
		}
		var err error
		work, cmds, err = tx.ClaimDue(ctx, due)
		return err
	})
	// What the claim delivered awaits its settlement, unless it left
	// commands due (a full answer).
	awaiting := work.awaiting() || work.Commands && work.Config == ConfigNotDue && len(cmds) < due.Limit
	s.quiet.put(sess.NodeID, token, sess.Fencing, err == nil && work.quiet(), err == nil && awaiting)
	if err != nil {
		return DueWork{}, nil, err
	}
	s.observeDeliveries(cmds, now)
	return work, cmds, nil
}

// observeDeliveries counts commands delivered at now: a first delivery's
// latency since its issue, or a redelivery.
func (s *Service) observeDeliveries(cmds []Command, now time.Time) {
	for _, c := range cmds {
		if c.DeliveryCount == 1 {
			s.metrics.DeliveryLatency.Observe(now.Sub(c.IssuedAt).Seconds())
		} else {
			s.metrics.Redeliveries.Inc()
		}
	}
}

// Release makes commands a poll claimed due again at once: the answer that
// carried them failed part-way or was never read, so the node most likely
// never saw them. Most likely is not surely: each keeps the delivery the
// claim recorded, so a re-enrollment still treats a launch or stop among
// them as possibly applied (DECISIONS.md §1).
func (s *Service) Release(ctx context.Context, sess Session, cmds []Command) error {
	return s.release(ctx, sess, cmds, false)
}

// Unclaim makes commands a claim took due again at once, as though the
// claim had not taken them: no answer carried them (trimmed from a full
// answer, handed to a poll that had answered already, or an answer that
// failed before its first byte). A first delivery undone leaves the
// command never delivered, so a re-enrollment or retirement before the
// next poll redelivers or cancels a launch or stop the node never saw
// instead of ending it outcome_unknown. The operation stays running: its
// claim happened, and the ledger's states do not go back.
func (s *Service) Unclaim(ctx context.Context, sess Session, cmds []Command) error {
	return s.release(ctx, sess, cmds, true)
}

func (s *Service) release(ctx context.Context, sess Session, cmds []Command, unsent bool) error {
	if len(cmds) == 0 {
		return nil
	}
	return s.store.Tx(OnNode(ctx, sess.NodeID), func(tx Tx) error {
		for _, c := range cmds {
			cur, err := tx.LockCommand(ctx, c.OperationID)
			if err != nil {
				return err
			}
			if cur.State != CommandPending || cur.DeliveredFencing == nil || *cur.DeliveredFencing != sess.Fencing {
				continue
			}
			if unsent {
				// Only the claim that answered c is undone: a count that
				// moved since is another claim's delivery, which stands.
				if cur.DeliveryCount != c.DeliveryCount {
					continue
				}
				cur.DeliveryCount--
				if cur.DeliveryCount == 0 {
					cur.DeliveredFencing, cur.FirstDeliveredAt = nil, nil
				}
			}
			cur.LastDeliveredAt = nil
			if err := tx.UpdateCommand(ctx, cur); err != nil {
				return err
			}
		}
		return tx.Notify(ctx, Notification{Kind: NotifyCommands, NodeID: sess.NodeID})
	})
}

// Settle records the node's results. Each result is answered on its own:
// applied or refused, or a per-item code (unknown_operation,
// not_this_node). Settling again answers the recorded outcome and changes
// nothing.
func (s *Service) Settle(ctx context.Context, sess Session, results []api.Result) ([]api.Settled, error) {
	var v errcode.Validation
	v.Check(len(results) <= MaxEventBatch, "results", "at most %d per request", MaxEventBatch)
	for i, r := range results {
		if r.OperationID == "" {
			v.Add("results", "result %d: operation_id is required", i)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	values, err := s.failureValues(ctx, results)
	if err != nil {
		return nil, err
	}
	now := s.clock()
	// What each result asks for is decided before the transaction; only
	// a diagnose's evidence needs its command (its delivery time) to be
	// settled, so a request without evidence — nearly every one — is
	// locked and written by one store call (Store.Settle), which may share
	// its statement with other nodes' settlements.
	decided := make([]Settlement, len(results))
	plain := true
	for i, r := range results {
		decided[i] = decideResult(r, values)
		plain = plain && len(r.Evidence) == 0
	}
	var out []api.Settled
	var fresh []CommandState
	pendingLeft := true
	if plain {
		out, fresh, pendingLeft, err = settlePlain(ctx, s.store, sess.NodeID, results, decided, now)
	} else {
		err = s.store.Tx(OnNode(ctx, sess.NodeID), func(tx Tx) error {
			var err error
			out, fresh, pendingLeft, err = s.settleLocked(ctx, tx, sess.NodeID, results, decided, values, now)
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	if !pendingLeft {
		// The node's next poll need not read to learn it has nothing
		// pending (dueMemo), if nothing was announced for it meanwhile.
		s.quiet.settled(sess.NodeID, sess.Fencing)
	}
	for _, st := range fresh {
		s.metrics.CommandsSettled.WithLabelValues(string(st)).Inc()
	}
	return out, nil
}

// decideResult is the settlement a result asks for, should its command
// still be pending: applied (a duplicate too), or refused by the node with
// its failure text scrubbed of values.
func decideResult(r api.Result, values []string) Settlement {
	if r.Applied || r.Duplicate {
		return Settlement{OperationID: r.OperationID, State: CommandApplied, Duplicate: r.Duplicate}
	}
	return Settlement{OperationID: r.OperationID, State: CommandRefused, FailureCode: "refused_by_node",
		FailureMessage: scrubFailure(secrets.Scrub(r.Failure, values))}
}

// settledItem is the answer for a command in state st (failure code: a
// refusal's).
func settledItem(operationID string, st CommandState, code string) api.Settled {
	item := api.Settled{OperationID: operationID, State: string(st)}
	if st == CommandRefused {
		item.Code = code
	}
	return item
}

// settlePlain settles results that carry no evidence (decided: their
// settlements, in order) in one store call (Store.Settle) and builds
// the answers settleLocked would from what it found: an id asked twice
// is settled by its first result and answered the same both times. It
// answers the answers, the states of the commands it settled, and whether
// the node may have a command pending (true when none was settled).
func settlePlain(ctx context.Context, st Store, nodeID string, results []api.Result, decided []Settlement, now time.Time) ([]api.Settled, []CommandState, bool, error) {
	ss := make([]Settlement, 0, len(decided))
	first := make(map[string]int, len(decided)) // id → its settlement in ss
	for _, d := range decided {
		if _, seen := first[d.OperationID]; !seen {
			first[d.OperationID] = len(ss)
			ss = append(ss, d)
		}
	}
	found, left, err := st.Settle(OnNode(ctx, nodeID), nodeID, now, ss)
	if err != nil {
		return nil, nil, false, err
	}
	byID := make(map[string]SettleFound, len(found))
	for _, f := range found {
		byID[f.OperationID] = f
	}
	out := make([]api.Settled, 0, len(results))
	answers := make(map[string]api.Settled, len(ss))
	var fresh []CommandState
	for _, r := range results {
		item, done := answers[r.OperationID]
		if !done {
			f, ok := byID[r.OperationID]
			d := ss[first[r.OperationID]]
			switch {
			case !ok:
				item = api.Settled{OperationID: r.OperationID, Code: string(errcode.Of(errUnknownOperation))}
			case f.NodeID != nodeID:
				item = api.Settled{OperationID: r.OperationID, Code: string(errcode.Of(errNotThisNode))}
			case f.Settled:
				item = settledItem(r.OperationID, d.State, d.FailureCode)
				fresh = append(fresh, d.State)
			case f.State == CommandPending:
				return nil, nil, false, fmt.Errorf("command %s of node %s found pending and left unsettled", f.OperationID, nodeID)
			default:
				item = settledItem(r.OperationID, f.State, f.FailureCode)
			}
			answers[r.OperationID] = item
		}
		out = append(out, item)
	}
	if len(fresh) == 0 {
		left = true
	}
	return out, fresh, left, nil
}

// settleLocked settles results read against their commands (a diagnose's
// evidence): every command of the request is locked in one statement and
// every settlement written in one, round trips per request, not per
// result. It answers as settlePlain does.
func (s *Service) settleLocked(ctx context.Context, tx Tx, nodeID string, results []api.Result, decided []Settlement, values []string, now time.Time) ([]api.Settled, []CommandState, bool, error) {
	ids := make([]string, len(results))
	for i, r := range results {
		ids[i] = r.OperationID
	}
	locked, err := tx.LockCommands(ctx, ids)
	if err != nil {
		return nil, nil, false, err
	}
	out := make([]api.Settled, 0, len(results))
	var newly []Command
	var fresh []CommandState
	for i, r := range results {
		c, isNew, err := settleDecided(locked, nodeID, decided[i], r.Evidence, values, now)
		switch {
		case err == nil:
			out = append(out, settledItem(r.OperationID, c.State, c.FailureCode))
			if isNew {
				newly = append(newly, c)
				fresh = append(fresh, c.State)
			}
		case errcode.Of(err) == errcode.UnknownOperation || errcode.Of(err) == errcode.NotThisNode:
			out = append(out, api.Settled{OperationID: r.OperationID, Code: string(errcode.Of(err))})
		default:
			return nil, nil, false, err
		}
	}
	pendingLeft := true
	if len(newly) > 0 {
		if pendingLeft, err = tx.SettleCommands(ctx, newly); err != nil {
			return nil, nil, false, err
		}
	}
	return out, fresh, pendingLeft, nil
}

var (
	errUnknownOperation = errcode.New(errcode.UnknownOperation, "no such operation")
	errNotThisNode      = errcode.New(errcode.NotThisNode, "operation belongs to another node")
)

// failureValues answers the secret values the commands of the refused
// results (and of results carrying evidence) were given, to scrub from the
// nodes' failure text and evidence. They are
// read before the settling transaction; removing one command's values
// from another's text removes nothing that should stay.
func (s *Service) failureValues(ctx context.Context, results []api.Result) ([]string, error) {
	var ids []string
	for _, r := range results {
		if (!r.Applied && !r.Duplicate && r.Failure != "") || len(r.Evidence) > 0 {
			ids = append(ids, r.OperationID)
		}
	}
	if len(ids) == 0 || s.secretValues == nil {
		return nil, nil
	}
	return s.secretValues(ctx, ids...)
}

// settleOne settles one result against the commands the transaction
// locked (and records the new state there, so the same id twice in one
// request answers the first settlement); fresh reports a state change,
// which the caller writes. values are secret values to scrub from the
// node's failure text.
func (s *Service) settleOne(locked map[string]Command, nodeID string, r api.Result, values []string, now time.Time) (Command, bool, error) {
	return settleDecided(locked, nodeID, decideResult(r, values), r.Evidence, values, now)
}

// settleDecided is settleOne for the settlement decideResult made of a
// result, and the result's evidence (a diagnose's, scrubbed of values).
func settleDecided(locked map[string]Command, nodeID string, d Settlement, evidence json.RawMessage, values []string, now time.Time) (Command, bool, error) {
	c, ok := locked[d.OperationID]
	if !ok {
		return Command{}, false, errUnknownOperation
	}
	if c.NodeID != nodeID {
		return Command{}, false, errNotThisNode
	}
	if c.State != CommandPending {
		return c, false, nil
	}
	c.State = d.State
	if d.State == CommandApplied {
		if c.Kind == api.KindDiagnose {
			settleEvidence(&c, evidence, values, now)
		}
	} else {
		c.FailureCode, c.FailureMessage = d.FailureCode, d.FailureMessage
	}
	c.SettledAt = &now
	c.Duplicate = d.Duplicate
	// The settlement is recorded as the end of the command's operation (the
	// store keeps the two in step), not as a node audit row.
	locked[d.OperationID] = c
	return c, true, nil
}

// scrubFailure bounds a node's failure text and keeps it printable (its
// secret values are replaced before, while they are whole).
func scrubFailure(s string) string {
	if s == "" {
		return "refused by the node (no reason given)"
	}
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\n' && r != '\t' {
			return -1
		}
		return r
	}, s)
	if len(s) > maxFailureBytes {
		cut := maxFailureBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
