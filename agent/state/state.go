// Package state owns the agent's state directory: everything the agent must
// remember across its own restarts so that a command is never applied twice,
// a result is never lost before the control plane acknowledged it, and an
// event is never lost before the control plane recorded it.
//
// Layout (directory 0700, every file 0600, every file written atomically via
// temp file + fsync + rename + directory fsync):
//
//	<dir>/LOCK                  flock held by the one agent using the directory
//	<dir>/session.json          the session: token, expiry, ttl, fencing token,
//	                            node id, lease and heartbeat seconds, control
//	                            plane URL and CA (so no bootstrap is needed again)
//	<dir>/ops/<sha256(id)>.json one record per operation: "started" (intent,
//	                            written before the effect) then "done" with its
//	                            result; acked once the server settled the result
//	<dir>/spool/<seq>.json      events not yet recorded by the server, oldest first
//	<dir>/reported.json         the last workload state reported per attempt
//	<dir>/outputs.json          exited attempts whose output is not yet uploaded
//	<dir>/fatal.json            why the agent stopped needing a reinvite (removed
//	                            by the next successful enrollment)
//	<dir>/config/current.json   the desired configuration's document (config.go)
//	<dir>/config/current.meta.json  its {revision, hash, format}
//	<dir>/config/status.json    applying (before the hook) / applied / failed,
//	                            the revision the agent remembers across restarts
//	<dir>/artifacts/sha256/<hex>   content-addressed artifact cache (package runtime)
//	<dir>/artifacts/ids/<id>.json  artifact id -> digest
//	<dir>/images/unpacked/<hex>/   an artifact unpacked once, by digest
//	<dir>/images/names/<h>.json    image name -> unpacked tree
//	<dir>/workloads/<run>/work/    the run's working directory (HOME, cwd)
//	<dir>/workloads/<run>/attempts/<attempt>/  record.json, supervise.lock,
//	                            shim.json, status.json, exit.json, stdout.log,
//	                            stderr.log, shim.log: written by the agent and
//	                            by the attempt's supervisor (the shim)
//	<dir>/volumes/<name>/       cache volumes shared by workloads
//
// The ops records are both the applied-operations journal and the store of
// unacknowledged results: a "done" record that is not acked is a result the
// agent still owes the server; it is sent on every flush and in the enroll
// request (DECISIONS §1) until a results answer settles it.
//
// The spool is capped: past MaxEvents the oldest heartbeats are dropped first
// (a heartbeat is an observation superseded by the next one); workload and
// configuration events are never dropped: when only those are left,
// AppendEvent refuses with ErrSpoolFull so the caller keeps the report owed
// and tries again later, loudly.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeward/nodeward/agent/api"
)

// Errors returned by the Store.
var (
	// ErrNoSession: the directory holds no session (never enrolled, or the
	// session was cleared after a fatal refusal).
	ErrNoSession = errors.New("state: no session")
	// ErrLocked: another agent process holds the state directory.
	ErrLocked = errors.New("state: state directory is in use by another agent")
	// ErrSpoolFull: the spool holds MaxEvents events that are never dropped
	// (workload, configuration) and no heartbeat can make room; the event was
	// not stored.
	ErrSpoolFull = errors.New("state: event spool full of workload events")
	// ErrUnknownOp: no record for that operation id.
	ErrUnknownOp = errors.New("state: unknown operation")
)

// Operation record states.
const (
	// OpStarted is written before the effect of a command is attempted.
	OpStarted = "started"
	// OpDone is written once the effect was applied or refused; Result holds
	// the answer.
	OpDone = "done"
)

// Session is the credential and the timing the control plane granted.
type Session struct {
	ControlPlaneURL  string `json:"control_plane_url"`
	CACertificatePEM string `json:"ca_certificate_pem,omitempty"`
	NodeID           string `json:"node_id"`
	RentalID         string `json:"rental_id,omitempty"`
	Generation       int64  `json:"generation"`
	// EnrollmentTokenSHA256 identifies the bootstrap this session came from,
	// so a restart with the same (spent) bootstrap reuses the session and a
	// restart with a fresh one (a reinvite) enrolls again.
	EnrollmentTokenSHA256 string    `json:"enrollment_token_sha256"`
	SessionToken          string    `json:"session_token"`
	SessionExpiresAt      time.Time `json:"session_expires_at"`
	SessionTTLSeconds     int64     `json:"session_ttl_seconds"`
	FencingToken          int64     `json:"fencing_token"`
	LeaseSeconds          int64     `json:"lease_seconds"`
	HeartbeatSeconds      int64     `json:"heartbeat_seconds"`
	EnrolledAt            time.Time `json:"enrolled_at"`
	RenewedAt             time.Time `json:"renewed_at,omitzero"`
}

// Op is the record of one operation.
type Op struct {
	OperationID  string          `json:"operation_id"`
	Kind         string          `json:"kind"`
	FencingToken int64           `json:"fencing_token"`
	Payload      json.RawMessage `json:"payload,omitempty"`
	State        string          `json:"state"`
	Result       *api.Result     `json:"result,omitempty"`
	Acked        bool            `json:"acked"`
	StartedAt    time.Time       `json:"started_at"`
	FinishedAt   time.Time       `json:"finished_at,omitzero"`
	AckedAt      time.Time       `json:"acked_at,omitzero"`
}

// Options tune a Store. The zero value is the production setting.
type Options struct {
	// NoSync skips fsyncs (for simulators only: a crash may lose records).
	NoSync bool
	// MaxEvents caps the spool (default 10000).
	MaxEvents int
	// AckedRetention is how long acknowledged operation records are kept to
	// answer late redeliveries as duplicates (default 30 days).
	AckedRetention time.Duration
	// Now is the wall clock (default time.Now).
	Now func() time.Time
	// LockWait is how long Open keeps trying for the directory's lock
	// before answering ErrLocked (default 0: one try). An agent restarted
	// the instant its predecessor was killed can find the lock still held
	// for a moment by a child the predecessor was starting (a forked
	// process holds every descriptor until it execs); waiting a little
	// tells that moment from a second agent, which holds it for good.
	LockWait time.Duration
}

type spooled struct {
	seq uint64
	ev  api.Event
}

// Store is the state directory of one agent. It is safe for concurrent use.
type Store struct {
	dir     string
	durable bool
	opts    Options
	lock    *os.File

	mu                sync.Mutex // guards the following
	ops               map[string]*Op
	spool             []spooled // ordered by seq
	spoolIDs          map[string]bool
	nextSeq           uint64
	reported          map[string]string
	outputs           map[string]OwedOutput // by run/attempt
	droppedHeartbeats int
}

// Open opens (creating if needed) the state directory dir and locks it against
// a second agent. It loads the operation records and the spool, and prunes
// operation records acknowledged longer ago than AckedRetention.
func Open(dir string, opts Options) (*Store, error) {
	if opts.MaxEvents <= 0 {
		opts.MaxEvents = 10000
	}
	if opts.AckedRetention <= 0 {
		opts.AckedRetention = 30 * 24 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{abs, filepath.Join(abs, "ops"), filepath.Join(abs, "spool")} {
		if err := MkdirPrivate(d); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	lf, err := os.OpenFile(filepath.Join(abs, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := flockWithin(lf, opts.LockWait); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, abs)
		}
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	s := &Store{
		dir:      abs,
		durable:  !opts.NoSync,
		opts:     opts,
		lock:     lf,
		ops:      map[string]*Op{},
		spoolIDs: map[string]bool{},
		reported: map[string]string{},
	}
	if err := s.load(); err != nil {
		lf.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) load() error {
	ents, err := os.ReadDir(filepath.Join(s.dir, "ops"))
	if err != nil {
		return err
	}
	now := s.opts.Now()
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(s.dir, "ops", e.Name())
		var op Op
		if err := ReadJSON(p, &op); err != nil {
			return fmt.Errorf("load operation record: %w", err)
		}
		if op.Acked && now.Sub(op.AckedAt) > s.opts.AckedRetention {
			os.Remove(p)
			continue
		}
		s.ops[op.OperationID] = &op
	}
	ents, err = os.ReadDir(filepath.Join(s.dir, "spool"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, ".json"), 10, 64)
		if err != nil {
			continue
		}
		var ev api.Event
		if err := ReadJSON(filepath.Join(s.dir, "spool", name), &ev); err != nil {
			// A spool entry is written atomically, so a bad one was not
			// written by us; dropping it loses nothing we promised.
			os.Remove(filepath.Join(s.dir, "spool", name))
			continue
		}
		s.spool = append(s.spool, spooled{seq: seq, ev: ev})
		s.spoolIDs[ev.ID] = true
		if seq >= s.nextSeq {
			s.nextSeq = seq + 1
		}
	}
	sort.Slice(s.spool, func(i, j int) bool { return s.spool[i].seq < s.spool[j].seq })
	if err := ReadJSON(filepath.Join(s.dir, "reported.json"), &s.reported); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if s.reported == nil {
		s.reported = map[string]string{}
	}
	return s.loadOutputs()
}

// Close releases the directory lock.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

// Dir is the absolute path of the state directory.
func (s *Store) Dir() string { return s.dir }

// Path joins elem under the state directory.
func (s *Store) Path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// Durable reports whether writes are fsynced.
func (s *Store) Durable() bool { return s.durable }

// Session loads the stored session; ErrNoSession when there is none.
func (s *Store) Session() (Session, error) {
	var sess Session
	err := ReadJSON(s.Path("session.json"), &sess)
	if errors.Is(err, fs.ErrNotExist) {
		return Session{}, ErrNoSession
	}
	if err != nil {
		return Session{}, err
	}
	if sess.SessionToken == "" {
		return Session{}, ErrNoSession
	}
	return sess, nil
}

// SaveSession durably replaces the stored session.
func (s *Store) SaveSession(sess Session) error {
	return WriteJSONAtomic(s.Path("session.json"), sess, s.durable)
}

// ClearSession removes the stored session (after a refusal that makes it
// useless: fenced, expired), keeping everything else.
func (s *Store) ClearSession() error {
	err := os.Remove(s.Path("session.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if s.durable {
		return SyncDir(s.dir)
	}
	return nil
}

func opFile(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:]) + ".json"
}

func (s *Store) writeOpLocked(op *Op) error {
	return WriteJSONAtomic(s.Path("ops", opFile(op.OperationID)), op, s.durable)
}

// Op returns a copy of the record of operation id.
func (s *Store) Op(id string) (Op, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[id]
	if !ok {
		return Op{}, false
	}
	return *op, true
}

// BeginOp durably records the intent to apply cmd (state "started"). It must
// return before the effect is attempted: the record is what tells a restarted
// agent that the effect may have happened. Beginning an operation that already
// has a record returns that record unchanged.
func (s *Store) BeginOp(cmd api.Command) (Op, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if op, ok := s.ops[cmd.OperationID]; ok {
		return *op, nil
	}
	op := &Op{
		OperationID:  cmd.OperationID,
		Kind:         cmd.Kind,
		FencingToken: cmd.FencingToken,
		Payload:      cmd.Payload,
		State:        OpStarted,
		StartedAt:    s.opts.Now().UTC(),
	}
	if err := s.writeOpLocked(op); err != nil {
		return Op{}, fmt.Errorf("record operation start: %w", err)
	}
	s.ops[op.OperationID] = op
	return *op, nil
}

// FinishOp durably records the answer for operation id (state "done", not yet
// acknowledged). Only after it returns may the result be reported.
func (s *Store) FinishOp(id string, res api.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[id]
	if !ok {
		return ErrUnknownOp
	}
	next := *op
	res.OperationID = id
	next.State = OpDone
	next.Result = &res
	next.Acked = false
	next.FinishedAt = s.opts.Now().UTC()
	if err := s.writeOpLocked(&next); err != nil {
		return fmt.Errorf("record operation result: %w", err)
	}
	*op = next
	return nil
}

// Redelivered records that a done operation was delivered again: its answer
// is owed again (a redelivery means the server has not settled it). An applied
// operation is now answered duplicate, never applied again — except a
// diagnose, which is read-only and whose answer is its evidence: it is
// answered again as it was, evidence and all (a bare duplicate would leave
// its operation without evidence).
func (s *Store) Redelivered(id string) (api.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[id]
	if !ok || op.State != OpDone || op.Result == nil {
		return api.Result{}, ErrUnknownOp
	}
	next := *op
	res := *op.Result
	if res.Applied && op.Kind != api.KindDiagnose {
		res.Duplicate = true
	}
	next.Result = &res
	next.Acked = false
	if err := s.writeOpLocked(&next); err != nil {
		return api.Result{}, err
	}
	*op = next
	return res, nil
}

// StartedOps lists operations begun but never finished (interrupted by a
// crash or a shutdown), oldest first.
func (s *Store) StartedOps() []Op {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Op
	for _, op := range s.ops {
		if op.State == OpStarted {
			out = append(out, *op)
		}
	}
	slices.SortFunc(out, func(a, b Op) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// UnackedResults lists the results the server has not acknowledged, in the
// order they were reached.
func (s *Store) UnackedResults() []api.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ops []*Op
	for _, op := range s.ops {
		if op.State == OpDone && !op.Acked && op.Result != nil {
			ops = append(ops, op)
		}
	}
	slices.SortFunc(ops, func(a, b *Op) int { return a.FinishedAt.Compare(b.FinishedAt) })
	out := make([]api.Result, 0, len(ops))
	for _, op := range ops {
		out = append(out, *op.Result)
	}
	return out
}

// flockWithin takes an exclusive lock on f, trying again until wait has
// passed; it answers the last try's error.
func flockWithin(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sameResult reports whether two results say the same thing.
func sameResult(a, b api.Result) bool {
	return a.OperationID == b.OperationID && a.Applied == b.Applied &&
		a.Duplicate == b.Duplicate && a.Failure == b.Failure &&
		bytes.Equal(a.Evidence, b.Evidence)
}

// AckResults marks these results, as they were sent, acknowledged by the
// server. A result that changed since it was sent (a redelivery turned it
// into a duplicate answer, owed anew) stays owed; unknown ids are ignored.
func (s *Store) AckResults(sent []api.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now().UTC()
	for _, r := range sent {
		op, ok := s.ops[r.OperationID]
		if !ok || op.State != OpDone || op.Acked || op.Result == nil || !sameResult(*op.Result, r) {
			continue
		}
		next := *op
		next.Acked = true
		next.AckedAt = now
		if err := s.writeOpLocked(&next); err != nil {
			return err
		}
		*op = next
	}
	return nil
}

// AppendEvent durably adds ev to the spool. An id already spooled is ignored
// (the event is already owed). When the spool is at MaxEvents the oldest
// heartbeat is dropped to make room; ErrSpoolFull when there is none.
func (s *Store) AppendEvent(ev api.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spoolIDs[ev.ID] {
		return nil
	}
	for len(s.spool) >= s.opts.MaxEvents {
		i := slices.IndexFunc(s.spool, func(e spooled) bool { return e.ev.Kind == api.EventHeartbeat })
		if i < 0 {
			return ErrSpoolFull
		}
		if err := s.removeSpooledLocked(i); err != nil {
			return err
		}
		s.droppedHeartbeats++
	}
	seq := s.nextSeq
	if err := WriteJSONAtomic(s.Path("spool", fmt.Sprintf("%020d.json", seq)), ev, s.durable); err != nil {
		return fmt.Errorf("spool event: %w", err)
	}
	s.nextSeq++
	s.spool = append(s.spool, spooled{seq: seq, ev: ev})
	s.spoolIDs[ev.ID] = true
	return nil
}

func (s *Store) removeSpooledLocked(i int) error {
	e := s.spool[i]
	err := os.Remove(s.Path("spool", fmt.Sprintf("%020d.json", e.seq)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.spool = slices.Delete(s.spool, i, i+1)
	delete(s.spoolIDs, e.ev.ID)
	return nil
}

// PendingEvents returns up to max spooled events, oldest first.
func (s *Store) PendingEvents(max int) []api.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(max, len(s.spool))
	out := make([]api.Event, 0, n)
	for _, e := range s.spool[:n] {
		out = append(out, e.ev)
	}
	return out
}

// RemoveEvents drops the spooled events with these ids (the server recorded
// them). Removal need not be durable: an event that comes back after a crash
// is sent again and deduplicated by the server by its id.
func (s *Store) RemoveEvents(ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	drop := map[string]bool{}
	for _, id := range ids {
		drop[id] = true
	}
	for i := 0; i < len(s.spool); {
		if drop[s.spool[i].ev.ID] {
			if err := s.removeSpooledLocked(i); err != nil {
				return err
			}
			continue
		}
		i++
	}
	return nil
}

// SpoolStats reports the spool length and how many heartbeats the cap dropped.
func (s *Store) SpoolStats() (pending, droppedHeartbeats int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.spool), s.droppedHeartbeats
}

// Reported is the last workload state reported (spooled) for key.
func (s *Store) Reported(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reported[key]
}

// SetReported durably records that state was spooled for key.
func (s *Store) SetReported(key, state string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reported[key] == state {
		return nil
	}
	next := maps.Clone(s.reported)
	next[key] = state
	if err := WriteJSONAtomic(s.Path("reported.json"), next, s.durable); err != nil {
		return err
	}
	s.reported = next
	return nil
}
