// Package core is the node agent's state machine: enroll once, then keep a
// session (renewal), report (heartbeats, workload events, results, each
// exited attempt's output, configuration outcomes) and long-poll for
// commands, applying each command's effect exactly once, and for the
// desired configuration, converging on it (config.go).
//
// It runs over three collaborators: the wire client (package client), the
// state directory (package state) and a runtime (package runtime). The agent
// listens on nothing; every exchange is a request it makes.
//
// # Exactly-once effects
//
// Delivery is at-least-once; the agent makes the effect exactly-once with a
// write-ahead journal in the state directory:
//
//  1. Before an effect is attempted, the operation is recorded "started"
//     (fsynced). A command whose operation id has a record is never started
//     again from scratch.
//  2. The effect is applied.
//  3. The answer is recorded "done" with its result (fsynced). Only then is
//     the result reported; it stays owed until the server's results answer
//     settles it (and is sent in the enroll request after a re-enrollment).
//
// A redelivered command is answered from its record: done and applied →
// duplicate:true (a diagnose, which is read-only: its recorded evidence
// again, never a bare duplicate — see diagnose.go); done and refused → the
// same refusal; started and still being applied in this process → nothing
// yet (DECISIONS §2). A diagnose interrupted by a crash is run again.
//
// A crash between 1 and 3 leaves a "started" record; on restart the agent
// resolves it before it asks for work, and never by blindly re-running a
// launch or a stop:
//   - prepare_artifact / prepare_image are re-run: they are content-addressed
//     and leave no effect beyond the cache.
//   - launch_workload asks the runtime to launch; the runtime answers from the
//     workload's own record: already started (its supervisor ran) →
//     ErrWorkloadExists, which is "applied" here; recorded but never spawned →
//     started now, for the first time; never recorded → started now.
//   - stop_workload is re-run: stopping an exited attempt does nothing,
//     and an attempt the stop already sent SIGTERM is not sent it again
//     (the runtime records the stop first): the resumed stop waits out
//     what is left of the grace, then SIGKILL.
//
// # Terminal refusals
//
// fenced, session_invalid, enrollment_invalid, enrollment_spent and
// enrollment_superseded end Run with a *FatalError: the node needs a
// reinvite. node_retired ends Run with ErrRetired after the agent stopped its
// workloads and delivered their exits and every pending result.
package core

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/nodeward/nodeward/agent/api"
	"github.com/nodeward/nodeward/agent/client"
	"github.com/nodeward/nodeward/agent/runtime"
	"github.com/nodeward/nodeward/agent/state"
)

// ErrRetired is returned by Run when the control plane retired the node and
// the agent has wound down (workloads stopped, exits and results delivered).
// The process should exit 0.
var ErrRetired = errors.New("node retired")

// FatalError ends Run when the node can no longer act without a new
// invitation. The process should exit non-zero and not be restarted blindly.
type FatalError struct {
	Code string // the refusal code, e.g. "fenced"
	Err  error
	// remembered: read back from fatal.json at start, so recorded already.
	remembered bool
}

func (e *FatalError) Error() string {
	return fmt.Sprintf("%s: a reinvite is needed (nodeward-agent --bootstrap NEW_BOOTSTRAP): %v", e.Code, e.Err)
}

func (e *FatalError) Unwrap() error { return e.Err }

// Config configures an Agent.
type Config struct {
	// Store is the opened state directory (required).
	Store *state.Store
	// Runtime carries out commands (required).
	Runtime runtime.Runtime
	// Bootstrap is the invitation. It may be nil when the state directory
	// holds a session. A bootstrap whose token differs from the one the
	// stored session came from (a reinvite) is enrolled.
	Bootstrap *api.Bootstrap
	// AllowInsecureHTTP permits plain http to a loopback control plane.
	AllowInsecureHTTP bool
	// HTTPClient replaces the wire client's default (tests, load tool).
	HTTPClient *http.Client
	// Labels are reported in the facts.
	Labels map[string]string
	// Version is this agent's version, reported at enrollment and in facts.
	Version string
	Clock   Clock
	Logger  *slog.Logger
	// PollWait is the long-poll wait asked of the server (default 25s).
	PollWait time.Duration
	// BackoffBase and BackoffMax bound retry delays (defaults 1s, 60s).
	BackoffBase, BackoffMax time.Duration
	// WatchInterval is how often workloads are observed (default 1s).
	WatchInterval time.Duration
	// FlushInterval is how often owed results and events are retried when
	// nothing new prompts a flush (default 10s).
	FlushInterval time.Duration
	// RetireGrace is the SIGTERM grace given to workloads at retirement
	// (default 10s).
	RetireGrace time.Duration
	// Rand returns values in [0,1) for jitter (default math/rand/v2).
	Rand func() float64
	// ConfigHook is the desired configuration's apply hook: a program and
	// its leading arguments, run with the document's path appended (see
	// config.go). Empty: writing the document is applying it.
	ConfigHook []string
	// ConfigHookTimeout bounds one run of the hook (default 60s).
	ConfigHookTimeout time.Duration
}

// Agent is one node agent.
type Agent struct {
	cfg   Config
	store *state.Store
	rt    runtime.Runtime
	clock Clock
	log   *slog.Logger
	kick  chan struct{} // asks the flusher to flush now
	// started is when this agent was made (the agent diagnostic's uptime).
	started time.Time

	wg        sync.WaitGroup // command applications and configuration applies
	conv      converger      // desired configuration (config.go)
	observeMu sync.Mutex     // one observer at a time: transitions stay in order

	mu       sync.Mutex // guards the following
	c        *client.Client
	sess     state.Session
	inflight map[string]bool          // operation ids being applied now
	chains   map[string]chan struct{} // per-target tail: commands on one target apply in order
	stats    Stats
}

// Stats count what the agent did; tests assert on them rather than on time.
type Stats struct {
	Enrollments     int
	Renewals        int
	Polls           int
	PollErrors      int
	ResumePolls     int // polls that asked the server to resume (pollLoop)
	Applied         int // effects attempted (started records written)
	Duplicates      int // redeliveries answered from the journal
	ResultsSettled  int
	EventsDelivered int
	// OutputsDelivered counts attempts whose output the server took.
	OutputsDelivered int
	// ConfigApplies counts configuration applies begun (document written),
	// ConfigHookRuns the apply hook's runs, ConfigReports the configuration
	// reports spooled.
	ConfigApplies, ConfigHookRuns, ConfigReports int
	// Backoffs lists the delays chosen after failed polls, in order.
	Backoffs []time.Duration
}

// New checks cfg and returns an Agent. It does not touch the network.
func New(cfg Config) (*Agent, error) {
	if cfg.Store == nil || cfg.Runtime == nil {
		return nil, errors.New("core: Store and Runtime are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 25 * time.Second
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 60 * time.Second
	}
	if cfg.WatchInterval <= 0 {
		cfg.WatchInterval = time.Second
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 10 * time.Second
	}
	if cfg.RetireGrace <= 0 {
		cfg.RetireGrace = 10 * time.Second
	}
	if cfg.ConfigHookTimeout <= 0 {
		cfg.ConfigHookTimeout = 60 * time.Second
	}
	return &Agent{
		cfg:      cfg,
		store:    cfg.Store,
		rt:       cfg.Runtime,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		kick:     make(chan struct{}, 1),
		started:  cfg.Clock.Now(),
		inflight: map[string]bool{},
		chains:   map[string]chan struct{}{},
	}, nil
}

// Stats returns a snapshot of the counters.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Backoffs = append([]time.Duration(nil), a.stats.Backoffs...)
	return s
}

// Session returns the current session (zero before enrollment).
func (a *Agent) Session() state.Session {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sess
}

func (a *Agent) client() *client.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.c
}

// Run is the agent's life: resolve interrupted operations, establish a
// session, then renew, heartbeat, poll, apply, report and observe until ctx
// ends (nil), the node is retired (ErrRetired) or a refusal makes it unable to
// continue (*FatalError). Workloads keep running when Run returns nil or a
// *FatalError: their supervisors own them.
func (a *Agent) Run(ctx context.Context) error {
	// Interrupted operations first, so their results are among those the
	// enroll request carries (DECISIONS §1).
	if err := a.recoverOps(ctx); err != nil {
		return a.stoppedEarly(ctx, err)
	}
	fresh, err := a.establish(ctx)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return a.stoppedEarly(ctx, err)
		}
		var fe *FatalError
		if errors.As(err, &fe) {
			a.recordFatal(fe)
		}
		if errors.Is(err, ErrRetired) {
			a.log.Warn("node retired before a session could be established; stopping workloads")
			a.stopAllWorkloads(context.WithoutCancel(ctx))
			a.log.Info("node retired; no session to report with; exiting")
		}
		return err
	}

	applyCtx, cancelApply := context.WithCancel(ctx)
	defer cancelApply()
	a.resumeConfig(applyCtx)
	loopCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var loops sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		loops.Add(1)
		go func() {
			defer loops.Done()
			if err := f(loopCtx); err != nil && loopCtx.Err() == nil {
				stop(err)
			}
		}()
	}
	run("renew", func(ctx context.Context) error { return a.renewLoop(ctx, fresh) })
	run("heartbeat", a.heartbeatLoop)
	run("poll", func(ctx context.Context) error { return a.pollLoop(ctx, applyCtx) })
	run("flush", a.flushLoop)
	run("watch", a.watchLoop)
	<-loopCtx.Done()
	cause := context.Cause(loopCtx)
	loops.Wait()

	switch {
	case errors.Is(cause, ErrRetired):
		a.log.Warn("control plane says node_retired: no more work; stopping workloads and delivering what is owed")
		// Commands already being applied finish: their results are owed and
		// a retired node's results are still accepted (DECISIONS §3).
		a.wg.Wait()
		return a.retire(context.WithoutCancel(ctx))
	case ctx.Err() != nil:
		cancelApply()
		a.wg.Wait()
		a.log.Info("agent stopped; workloads keep running under their supervisors")
		return nil
	default:
		cancelApply()
		a.wg.Wait()
		var fe *FatalError
		if errors.As(cause, &fe) {
			a.recordFatal(fe)
		}
		return cause
	}
}

// stoppedEarly answers Run's result when it ends before a session was
// established: a SIGTERM then (mid-enrollment, say) is a clean stop like
// any other, not a failure; anything else is err.
func (a *Agent) stoppedEarly(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		a.log.Info("agent stopped before a session was established; the next start carries on")
		return nil
	}
	return err
}

// fatalRecord is written to the state directory so the next start fails fast
// with the same explanation unless a new bootstrap is given.
type fatalRecord struct {
	Code   string    `json:"code"`
	Detail string    `json:"detail"`
	At     time.Time `json:"at"`
}

func (a *Agent) recordFatal(fe *FatalError) {
	if fe.remembered {
		// Rewriting it would nest the detail once more at every start.
		a.log.Error("fatal: this node needs a reinvite", "code", fe.Code, "err", fe.Err)
		return
	}
	a.explainExpiry(fe)
	if fe.Code == client.CodeFenced || fe.Code == client.CodeSessionInvalid {
		if err := a.store.ClearSession(); err != nil {
			a.log.Error("clear session", "err", err)
		}
	}
	_ = state.WriteJSONAtomic(a.store.Path("fatal.json"), fatalRecord{Code: fe.Code, Detail: fe.Err.Error(), At: a.clock.Now().UTC()}, a.store.Durable())
	a.log.Error("fatal: this node needs a reinvite", "code", fe.Code, "err", fe.Err)
}

// explainExpiry says why when session_invalid answers a session whose
// expiry has passed: renewal needs a session that is still valid
// (ARCHITECTURE.md, sessions), so an agent that could not reach the
// control plane for longer than the session lifetime (an outage, a
// partition, the machine switched off) needs a reinvite. The operator
// reading the log or fatal.json learns that, rather than suspecting a
// forgery or a key change.
func (a *Agent) explainExpiry(fe *FatalError) {
	if fe.Code != client.CodeSessionInvalid {
		return
	}
	sess := a.Session()
	if sess.SessionExpiresAt.IsZero() || a.clock.Now().Before(sess.SessionExpiresAt) {
		return
	}
	ttl := time.Duration(sess.SessionTTLSeconds) * time.Second
	fe.Err = fmt.Errorf("the session expired at %s before it could be renewed: this agent could not reach the control plane "+
		"(or was not running) for longer than the session lifetime of %s; a reinvite brings it back: %w",
		sess.SessionExpiresAt.UTC().Format(time.RFC3339), ttl, fe.Err)
}

func tokenDigest(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// establish loads the stored session or enrolls. It reports whether the
// session is fresh from the server (enrolled now) or restored from disk.
func (a *Agent) establish(ctx context.Context) (fresh bool, err error) {
	b := a.cfg.Bootstrap
	sess, err := a.store.Session()
	switch {
	case err == nil && (b == nil || tokenDigest(b.EnrollmentToken) == sess.EnrollmentTokenSHA256):
		c, err := a.newClient(sess.ControlPlaneURL, sess.CACertificatePEM)
		if err != nil {
			return false, err
		}
		c.SetSessionToken(sess.SessionToken)
		a.mu.Lock()
		a.c, a.sess = c, sess
		a.mu.Unlock()
		a.log.Info("session restored from state dir", "node_id", sess.NodeID, "fencing_token", sess.FencingToken, "expires_at", sess.SessionExpiresAt)
		return false, nil
	case err == nil:
		a.log.Info("bootstrap differs from the one the stored session came from: enrolling with it", "node_id", b.NodeID)
	case errors.Is(err, state.ErrNoSession):
		if b == nil {
			var fr fatalRecord
			if state.ReadJSON(a.store.Path("fatal.json"), &fr) == nil {
				return false, &FatalError{Code: fr.Code, Err: fmt.Errorf("stopped earlier at %s: %s", fr.At.Format(time.RFC3339), fr.Detail), remembered: true}
			}
			return false, errors.New("no session in the state dir and no bootstrap: pass --bootstrap")
		}
	default:
		return false, fmt.Errorf("load session: %w", err)
	}
	return true, a.enroll(ctx, b)
}

func (a *Agent) newClient(url, ca string) (*client.Client, error) {
	return client.New(client.Options{
		BaseURL:           url,
		AllowInsecureHTTP: a.cfg.AllowInsecureHTTP,
		CACertificatePEM:  ca,
		HTTPClient:        a.cfg.HTTPClient,
		UserAgent:         "nodeward-agent/" + a.cfg.Version,
	})
}

// enroll redeems the bootstrap. Transient failures are retried with backoff;
// a refusal is final. Every attempt carries the bootstrap's nonce
// (enrollNonce), so an attempt that the server committed but whose answer
// was lost in transit is answered again on retry, at the same fencing
// token, rather than refused enrollment_spent.
func (a *Agent) enroll(ctx context.Context, b *api.Bootstrap) error {
	if b.NodeID == "" || b.EnrollmentToken == "" || b.ControlPlaneURL == "" {
		return errors.New("bootstrap: node_id, enrollment_token and control_plane_url are required")
	}
	if b.AgentVersion != "" && b.AgentVersion != a.cfg.Version {
		a.log.Warn("this agent's version differs from the version the control plane pins", "pinned", b.AgentVersion, "running", a.cfg.Version)
	}
	c, err := a.newClient(b.ControlPlaneURL, b.CACertificatePEM)
	if err != nil {
		return err
	}
	nonce, err := a.enrollNonce(b)
	if err != nil {
		return err
	}
	owed := a.store.UnackedResults()
	req := api.EnrollRequest{
		EnrollmentNonce:       nonce,
		NodeID:                b.NodeID,
		Generation:            b.Generation,
		EnrollmentToken:       b.EnrollmentToken,
		AgentVersion:          a.cfg.Version,
		Facts:                 a.collectFacts(),
		UnacknowledgedResults: owed,
	}
	bo := newBackoff(a.cfg.BackoffBase, a.cfg.BackoffMax, a.cfg.Rand)
	var resp *api.EnrollResponse
	for {
		resp, err = c.Enroll(ctx, req)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if t := terminal(err); t != nil {
			return t
		}
		var ce *client.Error
		if errors.As(err, &ce) && refusal(ce.Status) {
			return fmt.Errorf("enroll refused: %w", err)
		}
		d := bo.next()
		if ce != nil && ce.RetryAfter > d {
			d = ce.RetryAfter
		}
		a.log.Warn("enroll failed; retrying", "err", err, "in", d)
		if err := sleep(ctx, a.clock, d); err != nil {
			return err
		}
	}
	now := a.clock.Now().UTC()
	sess := state.Session{
		ControlPlaneURL:       b.ControlPlaneURL,
		CACertificatePEM:      b.CACertificatePEM,
		NodeID:                resp.NodeID,
		RentalID:              b.RentalID,
		Generation:            b.Generation,
		EnrollmentTokenSHA256: tokenDigest(b.EnrollmentToken),
		SessionToken:          resp.SessionToken,
		SessionExpiresAt:      resp.SessionExpiresAt,
		SessionTTLSeconds:     resp.SessionTTLSeconds,
		FencingToken:          resp.FencingToken,
		LeaseSeconds:          resp.LeaseSeconds,
		HeartbeatSeconds:      resp.HeartbeatSeconds,
		EnrolledAt:            now,
	}
	if sess.NodeID == "" {
		sess.NodeID = b.NodeID
	}
	if err := a.store.SaveSession(sess); err != nil {
		return fmt.Errorf("store session: %w", err)
	}
	// The enrollment transaction settled the results it carried.
	if err := a.store.AckResults(owed); err != nil {
		a.log.Error("acknowledge results settled by enrollment", "err", err)
	}
	_ = removeIfExists(a.store.Path("fatal.json"))
	_ = removeIfExists(a.store.Path(nonceFile))
	c.SetSessionToken(sess.SessionToken)
	a.mu.Lock()
	a.c, a.sess = c, sess
	a.stats.Enrollments++
	a.mu.Unlock()
	a.log.Info("enrolled", "node_id", sess.NodeID, "fencing_token", sess.FencingToken,
		"session_ttl_seconds", sess.SessionTTLSeconds, "heartbeat_seconds", sess.HeartbeatSeconds,
		"lease_seconds", sess.LeaseSeconds, "results_settled_at_enroll", len(owed))
	return nil
}

// nonceFile keeps the enrollment nonce of the bootstrap being redeemed.
const nonceFile = "enroll_nonce.json"

// nonceRecord is the enrollment nonce of one bootstrap's token.
type nonceRecord struct {
	EnrollmentTokenSHA256 string `json:"enrollment_token_sha256"`
	Nonce                 string `json:"nonce"`
}

// enrollNonce answers the nonce every attempt to redeem b carries: the one
// kept in the state dir for b's token, else a new random one, kept (synced)
// before any attempt uses it, so that the agent restarted in the middle of
// an enrollment retries with the nonce the server may already hold. It is
// removed once the session is stored.
func (a *Agent) enrollNonce(b *api.Bootstrap) (string, error) {
	path := a.store.Path(nonceFile)
	want := tokenDigest(b.EnrollmentToken)
	var rec nonceRecord
	if err := state.ReadJSON(path, &rec); err == nil && rec.EnrollmentTokenSHA256 == want && rec.Nonce != "" {
		return rec.Nonce, nil
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("enrollment nonce: %w", err)
	}
	rec = nonceRecord{EnrollmentTokenSHA256: want, Nonce: base64.RawURLEncoding.EncodeToString(raw[:])}
	if err := state.WriteJSONAtomic(path, rec, a.store.Durable()); err != nil {
		return "", fmt.Errorf("store enrollment nonce: %w", err)
	}
	return rec.Nonce, nil
}

// terminal maps a refusal that ends the agent's run to ErrRetired or a
// *FatalError; nil for anything worth retrying.
// refusal reports whether a 4xx status judged the request: 429 (slow
// down) and 408 (the body did not arrive in time) judged nothing, and the
// same request may well pass later.
func refusal(status int) bool {
	return status/100 == 4 && status != http.StatusTooManyRequests && status != http.StatusRequestTimeout
}

func terminal(err error) error {
	switch code := client.CodeOf(err); code {
	case client.CodeNodeRetired:
		return fmt.Errorf("%w: %v", ErrRetired, err)
	case client.CodeFenced, client.CodeSessionInvalid, client.CodeEnrollmentInvalid,
		client.CodeEnrollmentSpent, client.CodeEnrollmentSuperseded:
		return &FatalError{Code: code, Err: err}
	}
	return nil
}

// renewLoop keeps the session alive: renewal is scheduled on the monotonic
// clock at a jittered 50–70% of the TTL after the credential was received,
// well before it expires, so that retries have time. A restored session's
// age is unknown (its expiry is the server's wall clock), so it is renewed
// at once — which also tells a restarted agent promptly that it was fenced
// or retired while it was down.
func (a *Agent) renewLoop(ctx context.Context, fresh bool) error {
	next := time.Duration(0)
	if fresh {
		next = a.renewDelay(a.Session().SessionTTLSeconds)
	}
	bo := newBackoff(a.cfg.BackoffBase, a.cfg.BackoffMax, a.cfg.Rand)
	for {
		if err := sleep(ctx, a.clock, next); err != nil {
			return nil
		}
		resp, err := a.client().Renew(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if t := terminal(err); t != nil {
				return t
			}
			next = bo.next()
			a.warnRenewal(err, next)
			continue
		}
		bo.reset()
		a.mu.Lock()
		a.sess.SessionToken = resp.SessionToken
		a.sess.SessionExpiresAt = resp.SessionExpiresAt
		if resp.SessionTTLSeconds > 0 {
			a.sess.SessionTTLSeconds = resp.SessionTTLSeconds
		}
		a.sess.RenewedAt = a.clock.Now().UTC()
		sess := a.sess
		a.stats.Renewals++
		a.mu.Unlock()
		if err := a.store.SaveSession(sess); err != nil {
			a.log.Error("store renewed session", "err", err)
		}
		a.client().SetSessionToken(resp.SessionToken)
		next = a.renewDelay(sess.SessionTTLSeconds)
		a.log.Debug("session renewed", "expires_at", sess.SessionExpiresAt, "next_renewal_in", next)
	}
}

// warnRenewal logs a failed renewal. Within the last quarter of the
// session's life it is an error naming the expiry: past it the node
// needs a reinvite, and an operator who sees this in time can bring the
// control plane back before then.
func (a *Agent) warnRenewal(err error, retryIn time.Duration) {
	sess := a.Session()
	left := sess.SessionExpiresAt.Sub(a.clock.Now())
	if sess.SessionExpiresAt.IsZero() || left > time.Duration(sess.SessionTTLSeconds)*time.Second/4 {
		a.log.Warn("session renewal failed; retrying", "err", err, "in", retryIn, "session_expires_at", sess.SessionExpiresAt)
		return
	}
	if left <= 0 {
		// Still tried: only the control plane's answer is final (its
		// clock, and its leeway, may differ from this machine's).
		a.log.Error("the session expired before it could be renewed: this node will need a reinvite",
			"err", err, "in", retryIn, "session_expires_at", sess.SessionExpiresAt)
		return
	}
	a.log.Error("session renewal keeps failing: if the control plane is not reached before the session expires, this node needs a reinvite",
		"err", err, "in", retryIn, "session_expires_at", sess.SessionExpiresAt, "left", left.Truncate(time.Second))
}

func (a *Agent) renewDelay(ttlSeconds int64) time.Duration {
	if ttlSeconds <= 0 {
		ttlSeconds = 30 * 60
	}
	return jitter(time.Duration(ttlSeconds)*time.Second, 0.5, 0.7, a.cfg.Rand)
}

// heartbeatLoop spools a heartbeat with fresh facts at once, then every
// heartbeat_seconds.
func (a *Agent) heartbeatLoop(ctx context.Context) error {
	for {
		ev := api.Event{ID: uuid.NewString(), Kind: api.EventHeartbeat, ObservedAt: a.clock.Now().UTC()}
		f := a.collectFacts()
		ev.Facts = &f
		if err := a.store.AppendEvent(ev); err != nil {
			a.log.Error("spool heartbeat", "err", err)
		}
		a.flushSoon()
		hb := time.Duration(a.Session().HeartbeatSeconds) * time.Second
		if hb <= 0 {
			hb = 30 * time.Second
		}
		if err := sleep(ctx, a.clock, hb); err != nil {
			return nil
		}
	}
}

// lostConnectionRetryMax caps the poll retry delay while the control
// plane's process is gone (client.ConnectionLost: refused, reset, cut
// mid-answer), where the backoff would otherwise grow to BackoffMax. That
// is a restart, not overload: a refused connect costs the server nothing
// (the kernel answers it; 10,000 agents every 2.5–5 s is a few thousand
// resets a second), while a 60 s ceiling would keep agents away for up to
// a minute after a restart that took seconds (issue 13: every agent back
// ≤ 10 s after a restart). The delay stays jittered in [cap/2, cap), so a
// fleet cut off together does not come back together. Overload is
// answered 503/429 with Retry-After, and other failures (timeouts, DNS,
// unreachable networks: maybe a partition) still back off to BackoffMax.
const lostConnectionRetryMax = 5 * time.Second

// pollLoop long-polls for commands. Failures back off exponentially with
// jitter (reset by any success), held to lostConnectionRetryMax while the
// server's process is gone; a draining server's Retry-After is honoured as
// asked, since it says exactly when a replica will take us.
//
// The first poll of this process, and the first after a failed one, asks
// the server to resume (client.PollOptions): an answer to an earlier poll
// may have been lost — cut by a crash of either side, or this process died
// before reading it — and the server would otherwise hand its commands out
// again only after its 60 s visibility timeout. What it sends again is
// answered from the journal (dispatch: done → duplicate, running → nothing
// yet), as any redelivery is. A successful answer clears it.
func (a *Agent) pollLoop(ctx, applyCtx context.Context) error {
	bo := newBackoff(a.cfg.BackoffBase, a.cfg.BackoffMax, a.cfg.Rand)
	resume := true
	for {
		seq := a.nextPollSeq()
		resp, err := a.client().Poll(ctx, pollWait(a.cfg.PollWait, a.cfg.Rand), client.PollOptions{Resume: resume})
		if ctx.Err() != nil {
			return nil
		}
		a.mu.Lock()
		a.stats.Polls++
		if resume {
			a.stats.ResumePolls++
		}
		if err != nil {
			a.stats.PollErrors++
		}
		a.mu.Unlock()
		if err != nil {
			if t := terminal(err); t != nil {
				return t
			}
			resume = true
			var d time.Duration
			var ce *client.Error
			switch {
			case errors.As(err, &ce) && (ce.Code == client.CodeDraining || ce.Status == http.StatusServiceUnavailable || ce.Status == http.StatusTooManyRequests) && ce.RetryAfter > 0:
				d = ce.RetryAfter + jitter(time.Second, 0, 1, a.cfg.Rand)
				a.log.Info("control plane asked to wait; polling again after its Retry-After", "code", ce.Code, "status", ce.Status, "retry_after", ce.RetryAfter)
			case client.ConnectionLost(err):
				d = bo.nextUpTo(lostConnectionRetryMax)
				a.log.Warn("control plane unreachable (restarting?); polling again soon", "err", err, "in", d)
			default:
				d = bo.next()
				a.log.Warn("poll failed; backing off", "err", err, "in", d)
			}
			a.mu.Lock()
			a.stats.Backoffs = append(a.stats.Backoffs, d)
			a.mu.Unlock()
			if err := sleep(ctx, a.clock, d); err != nil {
				return nil
			}
			continue
		}
		bo.reset()
		resume = false
		// Applied beside the poll: a slow hook holds up neither commands
		// nor the next poll.
		if resp.Config != nil {
			a.offerConfig(applyCtx, seq, *resp.Config)
		}
		for _, cmd := range resp.Commands {
			a.dispatch(applyCtx, cmd)
		}
	}
}

// targetKey names what a command touches; commands on one target apply in
// the order they arrived (a stop never overtakes its launch), commands on
// different targets concurrently (a slow download does not hold up a stop).
func targetKey(cmd api.Command) string {
	var t struct {
		RunID      string `json:"run_id"`
		AttemptID  string `json:"attempt_id"`
		ArtifactID string `json:"artifact_id"`
		Image      string `json:"image"`
	}
	_ = json.Unmarshal(cmd.Payload, &t)
	switch cmd.Kind {
	case api.KindLaunchWorkload, api.KindStopWorkload:
		return "workload/" + t.RunID + "/" + t.AttemptID
	case api.KindPrepareArtifact:
		return "artifact/" + t.ArtifactID
	case api.KindPrepareImage:
		return "image/" + t.Image
	}
	return "op/" + cmd.OperationID
}

// dispatch answers a delivered command from the journal or starts applying it.
func (a *Agent) dispatch(ctx context.Context, cmd api.Command) {
	if cmd.OperationID == "" {
		a.log.Warn("command without operation_id ignored", "kind", cmd.Kind)
		return
	}
	a.mu.Lock()
	// The journal is asked first: an operation may be done (its result on
	// disk and maybe delivered) a moment before its goroutine winds down.
	op, known := a.store.Op(cmd.OperationID)
	if known && op.State == state.OpDone {
		a.stats.Duplicates++
		a.mu.Unlock()
		res, err := a.store.Redelivered(cmd.OperationID)
		if err != nil {
			a.log.Error("answer redelivered command", "operation_id", cmd.OperationID, "err", err)
			return
		}
		a.log.Info("redelivered command answered from the journal", "operation_id", cmd.OperationID, "kind", op.Kind, "applied", res.Applied, "duplicate", res.Duplicate)
		a.flushSoon()
		return
	}
	if a.inflight[cmd.OperationID] {
		a.mu.Unlock()
		a.log.Debug("redelivered command still being applied; answering nothing yet", "operation_id", cmd.OperationID)
		return
	}
	if s := a.sess.FencingToken; cmd.FencingToken != 0 && cmd.FencingToken < s {
		a.log.Warn("command carries an older fencing token than our session", "operation_id", cmd.OperationID, "command_fencing_token", cmd.FencingToken, "session_fencing_token", s)
	}
	a.inflight[cmd.OperationID] = true
	key := targetKey(cmd)
	prev := a.chains[key]
	done := make(chan struct{})
	a.chains[key] = done
	a.wg.Add(1)
	a.mu.Unlock()

	go func() {
		defer a.wg.Done()
		defer func() {
			a.mu.Lock()
			delete(a.inflight, cmd.OperationID)
			if a.chains[key] == done {
				delete(a.chains, key)
			}
			a.mu.Unlock()
			close(done)
		}()
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				return
			}
		}
		// known && started: recorded before an earlier crash yet not
		// resolved at startup (cannot normally happen); resolve it now.
		a.apply(ctx, cmd, known)
	}()
}

// apply runs the write-ahead sequence for one command (see the package doc).
func (a *Agent) apply(ctx context.Context, cmd api.Command, resumed bool) {
	log := a.log.With("operation_id", cmd.OperationID, "kind", cmd.Kind)
	if !resumed {
		if _, err := a.store.BeginOp(cmd); err != nil {
			// Without the intent on disk the effect must not happen; the
			// server will deliver the command again.
			log.Error("cannot record operation; not applying it", "err", err)
			return
		}
		a.mu.Lock()
		a.stats.Applied++
		a.mu.Unlock()
	}
	res, ok := a.execute(ctx, cmd, resumed, log)
	if !ok {
		log.Info("operation interrupted; it will be resolved from its record on the next start")
		return
	}
	if err := a.store.FinishOp(cmd.OperationID, res); err != nil {
		log.Error("cannot record operation result; it will be resolved on the next start", "err", err)
		return
	}
	if res.Applied {
		log.Info("operation applied")
	} else {
		log.Warn("operation refused", "failure", res.Failure)
	}
	a.flushSoon()
}

// execute applies the effect. ok is false when ctx ended before an answer was
// reached (the operation stays "started").
func (a *Agent) execute(ctx context.Context, cmd api.Command, resumed bool, log *slog.Logger) (api.Result, bool) {
	res := api.Result{OperationID: cmd.OperationID}
	refuse := func(err error) (api.Result, bool) {
		if ctx.Err() != nil {
			return res, false
		}
		res.Failure = err.Error()
		return res, true
	}
	decode := func(v any) error {
		if err := json.Unmarshal(cmd.Payload, v); err != nil {
			return fmt.Errorf("invalid %s payload: %v", cmd.Kind, err)
		}
		return nil
	}
	switch cmd.Kind {
	case api.KindPrepareArtifact:
		var p api.PrepareArtifact
		if err := decode(&p); err != nil {
			return refuse(err)
		}
		msg, err := a.rt.PrepareArtifact(ctx, p)
		if err != nil {
			return refuse(err)
		}
		log.Info(msg)
	case api.KindPrepareImage:
		var p api.PrepareImage
		if err := decode(&p); err != nil {
			return refuse(err)
		}
		msg, err := a.rt.PrepareImage(ctx, p)
		if err != nil {
			return refuse(err)
		}
		log.Info(msg)
	case api.KindLaunchWorkload:
		var p api.LaunchWorkload
		if err := decode(&p); err != nil {
			return refuse(err)
		}
		err := a.rt.Launch(ctx, p)
		switch {
		case errors.Is(err, runtime.ErrWorkloadExists) && resumed:
			// Our own launch, started before the crash: applied once.
			log.Info("interrupted launch had started the workload; not launching again", "run_id", p.RunID, "attempt_id", p.AttemptID)
		case errors.Is(err, runtime.ErrWorkloadExists):
			return refuse(fmt.Errorf("attempt %s/%s was already launched by another operation", p.RunID, p.AttemptID))
		case err != nil:
			return refuse(err)
		default:
			log.Info("workload launched", "run_id", p.RunID, "attempt_id", p.AttemptID)
		}
		// Report created/running promptly rather than at the next tick.
		a.observeOnce(ctx)
	case api.KindStopWorkload:
		var p api.StopWorkload
		if err := decode(&p); err != nil {
			return refuse(err)
		}
		if err := a.rt.Stop(ctx, p); err != nil {
			return refuse(err)
		}
		a.observeOnce(ctx)
	case api.KindDiagnose:
		ev, err := a.diagnose(ctx, cmd)
		if err != nil {
			return refuse(err)
		}
		res.Evidence = ev
	default:
		return refuse(fmt.Errorf("unsupported command kind %q", cmd.Kind))
	}
	res.Applied = true
	return res, true
}

// recoverOps resolves operations a previous run of the agent began but did
// not finish (see the package doc for why each kind is safe to resolve this
// way).
func (a *Agent) recoverOps(ctx context.Context) error {
	for _, op := range a.store.StartedOps() {
		a.log.Info("resolving operation interrupted by the last shutdown", "operation_id", op.OperationID, "kind", op.Kind)
		cmd := api.Command{OperationID: op.OperationID, Kind: op.Kind, FencingToken: op.FencingToken, Payload: op.Payload}
		a.apply(ctx, cmd, true)
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

func (a *Agent) flushSoon() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// flushLoop delivers owed results and spooled events whenever something new is
// owed and periodically, backing off while the control plane is unreachable.
func (a *Agent) flushLoop(ctx context.Context) error {
	bo := newBackoff(a.cfg.BackoffBase, a.cfg.BackoffMax, a.cfg.Rand)
	for {
		t := a.clock.NewTimer(a.cfg.FlushInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-a.kick:
		case <-t.C():
		}
		t.Stop()
		err := a.flush(ctx)
		if err == nil {
			bo.reset()
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if t := terminal(err); t != nil {
			return t
		}
		d := bo.next()
		a.log.Warn("delivering results and events failed; retrying", "err", err, "in", d)
		if err := sleep(ctx, a.clock, d); err != nil {
			return nil
		}
		a.flushSoon()
	}
}

// flush sends every owed result, spooled event and owed output once.
func (a *Agent) flush(ctx context.Context) error {
	if err := a.flushResults(ctx); err != nil {
		return err
	}
	if err := a.flushEvents(ctx); err != nil {
		return err
	}
	return a.flushOutputs(ctx)
}

func (a *Agent) flushResults(ctx context.Context) error {
	owed := a.store.UnackedResults()
	for len(owed) > 0 {
		batch := owed[:min(len(owed), client.MaxEventBatch)]
		owed = owed[len(batch):]
		resp, err := a.client().Results(ctx, batch)
		if err != nil {
			return err
		}
		sent := map[string]api.Result{}
		for _, r := range batch {
			sent[r.OperationID] = r
		}
		var acked []api.Result
		for _, s := range resp.Settled {
			// A state means settled; unknown_operation / not_this_node mean
			// the server will never settle it: keeping it owed forever would
			// help nobody.
			if s.State != "" || s.Code == client.CodeUnknownOperation || s.Code == client.CodeNotThisNode {
				if r, ok := sent[s.OperationID]; ok {
					acked = append(acked, r)
				}
				// With a state, Code is the refusal's own code (say
				// refused_by_node): settled, nothing to warn about.
				if s.State == "" {
					a.log.Warn("server will not settle result", "operation_id", s.OperationID, "code", s.Code)
				}
			}
		}
		if err := a.store.AckResults(acked); err != nil {
			return err
		}
		a.mu.Lock()
		a.stats.ResultsSettled += len(acked)
		a.mu.Unlock()
	}
	return nil
}

func (a *Agent) flushEvents(ctx context.Context) error {
	for {
		batch := a.store.PendingEvents(client.MaxEventBatch)
		if len(batch) == 0 {
			return nil
		}
		if err := a.sendEvents(ctx, batch); err != nil {
			return err
		}
	}
}

// sendEvents posts a batch and unspools it. A batch the server refuses as
// malformed is split so one bad event cannot block the spool forever; a
// single refused event is dropped with an error in the log — never silently.
func (a *Agent) sendEvents(ctx context.Context, batch []api.Event) error {
	_, err := a.client().Events(ctx, batch)
	var ce *client.Error
	if err != nil && errors.As(err, &ce) && terminal(err) == nil &&
		(ce.Status == http.StatusBadRequest || ce.Status == http.StatusRequestEntityTooLarge || ce.Status == http.StatusUnprocessableEntity) {
		if len(batch) == 1 {
			a.log.Error("control plane refused an event; dropping it", "event_id", batch[0].ID, "kind", batch[0].Kind, "err", err)
			if err := a.store.RemoveEvents([]string{batch[0].ID}); err != nil {
				return err
			}
			a.eventsDelivered([]string{batch[0].ID})
			return nil
		}
		mid := len(batch) / 2
		if err := a.sendEvents(ctx, batch[:mid]); err != nil {
			return err
		}
		return a.sendEvents(ctx, batch[mid:])
	}
	if err != nil {
		return err
	}
	ids := make([]string, len(batch))
	for i, e := range batch {
		ids[i] = e.ID
	}
	if err := a.store.RemoveEvents(ids); err != nil {
		return err
	}
	a.eventsDelivered(ids)
	a.mu.Lock()
	a.stats.EventsDelivered += len(batch)
	a.mu.Unlock()
	return nil
}

// watchLoop observes workloads every WatchInterval and spools each new
// lifecycle transition.
func (a *Agent) watchLoop(ctx context.Context) error {
	for {
		a.observeOnce(ctx)
		if err := sleep(ctx, a.clock, a.cfg.WatchInterval); err != nil {
			return nil
		}
	}
}

var workloadEventNS = uuid.MustParse("6f1c3a52-7a0e-4f8e-9a57-2f1d0c7b9e11")

var stateRank = map[string]int{"": 0, api.WorkloadCreated: 1, api.WorkloadRunning: 2, api.WorkloadExited: 3}

// observeOnce spools the transitions not yet reported. Event ids are derived
// from (run, attempt, state), so a transition spooled twice — a crash between
// spooling and recording it as reported — is one event to the server.
func (a *Agent) observeOnce(ctx context.Context) {
	a.observeMu.Lock()
	defer a.observeMu.Unlock()
	obs, err := a.rt.Observe(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Error("observe workloads", "err", err)
		}
		return
	}
	spooled := false
	for _, o := range obs {
		if o.Failure != "" && o.StartedAt.IsZero() {
			continue // never started: the launch's refusal says why
		}
		key := o.Key()
		last := a.store.Reported(key)
		for _, st := range []string{api.WorkloadCreated, api.WorkloadRunning, api.WorkloadExited} {
			if stateRank[st] <= stateRank[last] || stateRank[st] > stateRank[o.State] {
				continue
			}
			at := o.CreatedAt
			w := &api.WorkloadObservation{RunID: o.RunID, AttemptID: o.AttemptID, State: st}
			switch st {
			case api.WorkloadRunning:
				if o.StartedAt.IsZero() {
					continue // lost before it was seen running
				}
				at = o.StartedAt
			case api.WorkloadExited:
				at = o.ExitedAt
				w.ExitCode = o.ExitCode
			}
			if at.IsZero() {
				at = a.clock.Now()
			}
			if st == api.WorkloadExited {
				// Owed before the exit is spooled: a crash in between
				// re-spools the exit and finds the output owed already.
				if err := a.store.OweOutput(state.OwedOutput{RunID: o.RunID, AttemptID: o.AttemptID}); err != nil {
					a.log.Error("cannot record owed workload output; the exit stays unreported", "run_id", o.RunID, "attempt_id", o.AttemptID, "err", err)
					break
				}
			}
			w.ObservedAt = at.UTC()
			ev := api.Event{
				ID:         uuid.NewSHA1(workloadEventNS, []byte(key+"/"+st)).String(),
				Kind:       api.EventWorkload,
				ObservedAt: w.ObservedAt,
				Workload:   w,
			}
			if err := a.store.AppendEvent(ev); err != nil {
				// Not recorded as reported: the next observation tries again.
				a.log.Error("cannot spool workload event; it stays pending", "run_id", o.RunID, "attempt_id", o.AttemptID, "state", st, "err", err)
				break
			}
			if err := a.store.SetReported(key, st); err != nil {
				a.log.Error("record reported workload state", "err", err)
				break
			}
			last = st
			spooled = true
			attrs := []any{"run_id", o.RunID, "attempt_id", o.AttemptID, "state", st}
			if st == api.WorkloadExited {
				if o.ExitCode != nil {
					attrs = append(attrs, "exit_code", *o.ExitCode)
				}
				if o.Lost {
					attrs = append(attrs, "lost", true)
				}
			}
			a.log.Info("workload", attrs...)
		}
	}
	if spooled {
		a.flushSoon()
	}
}

// stopAllWorkloads stops every attempt not yet exited, concurrently, with
// the retirement grace.
func (a *Agent) stopAllWorkloads(ctx context.Context) int {
	obs, err := a.rt.Observe(ctx)
	if err != nil {
		a.log.Error("observe workloads", "err", err)
		return 0
	}
	var wg sync.WaitGroup
	n := 0
	for _, o := range obs {
		if o.State == api.WorkloadExited {
			continue
		}
		n++
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a.rt.Stop(ctx, api.StopWorkload{RunID: o.RunID, AttemptID: o.AttemptID, GraceSeconds: int(a.cfg.RetireGrace / time.Second)})
			if err != nil {
				a.log.Error("stop workload", "run_id", o.RunID, "attempt_id", o.AttemptID, "err", err)
			}
		}()
	}
	wg.Wait()
	return n
}

// retire winds the node down after node_retired: no more polling; stop
// workloads; report their exits and every owed result while the session
// still lasts (DECISIONS §3).
func (a *Agent) retire(ctx context.Context) error {
	n := a.stopAllWorkloads(ctx)
	a.observeOnce(ctx)
	bo := newBackoff(a.cfg.BackoffBase, min(a.cfg.BackoffMax, 10*time.Second), a.cfg.Rand)
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		if err = a.flush(ctx); err == nil {
			break
		}
		if t := terminal(err); t != nil && !errors.Is(t, ErrRetired) {
			break // the session is gone: nothing more can be delivered
		}
		if serr := sleep(ctx, a.clock, bo.next()); serr != nil {
			break
		}
	}
	results := len(a.store.UnackedResults())
	events, _ := a.store.SpoolStats()
	if err != nil {
		a.log.Error("node retired; could not deliver everything", "stopped_workloads", n, "undelivered_results", results, "undelivered_events", events, "err", err)
	} else {
		a.log.Info("node retired: workloads stopped, exits and results delivered; exiting", "stopped_workloads", n)
	}
	return ErrRetired
}

func removeIfExists(path string) error {
	err := os.Remove(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
