package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeward/nodeward/internal/dbtime"
	"github.com/nodeward/nodeward/keys"
	"github.com/nodeward/nodeward/metrics"
)

// Settings are the fleet's tunables; zero values take the defaults.
type Settings struct {
	// PublicURL is what bootstraps tell agents to dial.
	PublicURL string
	// AgentVersion is the pinned agent build named in bootstraps; empty
	// names none.
	AgentVersion string
	// CACertificatePEM is handed to agents when TLS uses a private CA.
	CACertificatePEM string
	// ReplicaID names this process in live-session listings.
	ReplicaID string

	SessionTTL         time.Duration // default 30 min
	Lease              time.Duration // default 90 s
	HeartbeatInterval  time.Duration // default Lease/3
	DefaultRedeemable  time.Duration // default 30 min
	MaxRedeemable      time.Duration // default 7 days
	VisibilityTimeout  time.Duration // default 60 s (DECISIONS.md §2)
	MaxPollBatch       int           // default 100
	LeaseFlushInterval time.Duration // default 50 ms
	SweepInterval      time.Duration // default 5 s
	// FallbackPoll is how often a waiting long-poll re-checks the store
	// while cross-replica notifications are down. Default 5 s.
	FallbackPoll time.Duration
	// NodeCacheTTL bounds how long a cached node record (fencing token,
	// retired, capabilities: nodeCache) is relied on while cross-replica
	// notifications may be missed. Default 10 s.
	NodeCacheTTL time.Duration
	// NodeCacheMaxAge bounds how long it is relied on while they flow
	// (every change to it is announced), and in a single process. Default
	// 5 min; negative: NodeCacheTTL always.
	NodeCacheMaxAge time.Duration
	// NodeCacheMaxNodes bounds how many nodes are cached. Default 200,000
	// (tens of MB at most).
	NodeCacheMaxNodes int
	// DueMemoMaxAge bounds how long a poll may rely on the last read's
	// finding that nothing is due for its node (dueMemo) before it reads
	// again anyway. Default 5 min; negative: every poll reads.
	DueMemoMaxAge time.Duration
	// DueMemoMaxNodes bounds how many nodes that finding is kept for.
	// Default 200,000 (a few MB).
	DueMemoMaxNodes int
	// SkipWarmUp leaves the node cache and due-work memo to fill read by
	// read, as agents ask (tests that count a cold memo's reads); by
	// default one read a page of nodes fills them at start and whenever
	// the notifier comes back (warm.go).
	SkipWarmUp bool
	// SessionCacheMaxTokens bounds how many verified session tokens are
	// remembered so an agent's next request skips the signature check
	// (sessionCache). Default 100,000 (two per agent across a renewal at
	// 50,000 agents; about 25 MB); negative: every request verifies.
	SessionCacheMaxTokens int
	// EnrollQueueTimeout bounds how long an enrollment may wait for its
	// turn to write. One that waited longer is not run: it is answered
	// ErrEnrollmentShed (503 overloaded, Retry-After) with its token still
	// unspent. The bound sits well under the agent's 30 s request
	// timeout, so under overload an agent hears "retry" from the server
	// rather than giving up on an enrollment that may still commit — the
	// one way its token could be spent with the answer lost. Default 10 s.
	EnrollQueueTimeout time.Duration
	// EnrollRetryWindow is how long after an enrollment its own agent may
	// redeem the same token again, with the same nonce, and be answered
	// a session at the same fencing token: the answer to an enrollment
	// that committed but never reached the agent. Default 10 minutes.
	EnrollRetryWindow time.Duration
}

func (s *Settings) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&s.SessionTTL, 30*time.Minute)
	def(&s.Lease, 90*time.Second)
	def(&s.HeartbeatInterval, s.Lease/3)
	def(&s.DefaultRedeemable, 30*time.Minute)
	def(&s.MaxRedeemable, 7*24*time.Hour)
	def(&s.VisibilityTimeout, 60*time.Second)
	def(&s.LeaseFlushInterval, 50*time.Millisecond)
	def(&s.SweepInterval, 5*time.Second)
	def(&s.FallbackPoll, 5*time.Second)
	def(&s.NodeCacheTTL, 10*time.Second)
	def(&s.EnrollQueueTimeout, 10*time.Second)
	def(&s.EnrollRetryWindow, 10*time.Minute)
	if s.MaxPollBatch <= 0 {
		s.MaxPollBatch = 100
	}
	if s.NodeCacheMaxAge == 0 {
		s.NodeCacheMaxAge = 5 * time.Minute
	}
	if s.NodeCacheMaxNodes <= 0 {
		s.NodeCacheMaxNodes = 200_000
	}
	if s.DueMemoMaxAge == 0 {
		s.DueMemoMaxAge = 5 * time.Minute
	}
	if s.DueMemoMaxNodes <= 0 {
		s.DueMemoMaxNodes = 200_000
	}
	if s.SessionCacheMaxTokens == 0 {
		s.SessionCacheMaxTokens = 100_000
	}
}

// Service is the fleet: every rule of nodes and commands.
type Service struct {
	store    Store
	settings Settings
	now      func() time.Time
	log      *slog.Logger
	metrics  *metrics.Metrics
	scrub    OutputScrubber

	secretValues func(ctx context.Context, operationIDs ...string) ([]string, error)
	sealer       DocumentSealer

	enrollSigner  *keys.Signer
	sessionSigner *keys.Signer

	cache *nodeCache
	// sessions remembers verified session tokens (sessionCache); its
	// answers are counted in nodeward_session_verifications_total.
	sessions                    *sessionCache
	sessionCached, sessionSigns prometheus.Counter
	hub                         *Hub
	leases                      *leaseBatcher
	// nodeHits and nodeReads count the node cache's answers and store
	// reads (nodeward_node_lookups_total{result}).
	nodeHits, nodeReads prometheus.Counter
	// quiet remembers which nodes' last due-work read found nothing due,
	// so their polls may skip the next (dueMemo).
	quiet *dueMemo

	// notifierHealthy is false while cross-replica notifications may be
	// missed; waiting long-polls then fall back to polling the store.
	notifierMu      sync.Mutex // guards the following
	notifierHealthy bool
	// rewarm asks warmLoop for a warm-up (the notifier came back).
	rewarm   chan struct{}
	warmPage int
	// crossReplica: other replicas may share the store; peers is what
	// publishLoop last saw of them (watchPeers).
	crossReplica bool
	peers        map[string]time.Time
	// greetedAt is when (UnixNano, s.now) another replica's listener last
	// said it connected (NotifyPeer); watchPeers counts it as present for
	// sessionsFreshFor even before its heartbeat row is seen.
	greetedAt atomic.Int64
}

// Options builds a Service.
type Options struct {
	Store    Store
	Keys     *keys.Ring
	Settings Settings
	Now      func() time.Time
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
	// CrossReplica is true when other replicas may share the store (the
	// Postgres dialect): long-polls then fall back to polling until a
	// notification listener reports healthy.
	CrossReplica bool
	// ScrubOutput removes secret values from workload output before it is
	// stored (default: the values SecretValues answers for the attempt's
	// launch commands).
	ScrubOutput OutputScrubber
	// SecretValues answers the secret values the operations' commands
	// were given (nil: nodes are given none), so node failure text and
	// workload output are scrubbed of them before they are stored.
	SecretValues func(ctx context.Context, operationIDs ...string) ([]string, error)
}

// New returns the fleet service. Call Run to start its background work.
func New(o Options) *Service {
	o.Settings.defaults()
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New(nil)
	}

	s := &Service{
		store:           o.Store,
		settings:        o.Settings,
		now:             o.Now,
		log:             o.Logger,
		metrics:         o.Metrics,
		scrub:           o.ScrubOutput,
		secretValues:    o.SecretValues,
		enrollSigner:    keys.NewSigner(o.Keys, keys.LabelNodeEnrollment, "nodeward-enroll", "enroll+jwt", o.Now),
		sessionSigner:   keys.NewSigner(o.Keys, keys.LabelNodeSession, "nodeward-node", "node+jwt", o.Now),
		notifierHealthy: !o.CrossReplica,
		crossReplica:    o.CrossReplica,
		rewarm:          make(chan struct{}, 1),
		warmPage:        defaultWarmPage,
	}
	if s.scrub == nil {
		s.scrub = s.scrubLaunchOutput
	}
	s.cache = newNodeCache(o.Settings, !o.CrossReplica, o.Now)
	s.nodeHits = o.Metrics.NodeLookups.WithLabelValues("hit")
	s.nodeReads = o.Metrics.NodeLookups.WithLabelValues("store")
	s.sessions = newSessionCache(o.Settings.SessionCacheMaxTokens)
	s.sessionCached = o.Metrics.SessionVerifications.WithLabelValues("cached")
	s.sessionSigns = o.Metrics.SessionVerifications.WithLabelValues("signature")
	s.hub = newHub(o.Metrics, o.Now)
	s.quiet = newDueMemo(o.Settings.DueMemoMaxAge, o.Settings.DueMemoMaxNodes, !o.CrossReplica, o.Now)
	s.leases = newLeaseBatcher(o.Store, o.Settings, o.Now, o.Metrics, o.Logger)
	return s
}

// Settings answers the effective settings.
func (s *Service) Settings() Settings { return s.settings }

// Hub answers the long-poll hub (for drain and live sessions).
func (s *Service) Hub() *Hub { return s.hub }

// Deliver applies notifications: from this replica's own commits (source
// "local") or from other replicas (source "notify").
func (s *Service) Deliver(notes []Notification, source string) {
	handed := handedIssues(notes)
	for i, n := range notes {
		switch n.Kind {
		case NotifyCommands:
			s.quiet.forget(n.NodeID)
			s.hub.Wake(n.NodeID, source)
		case NotifyIssued:
			if handed[i] {
				continue
			}
			s.quiet.forget(n.NodeID)
			s.hub.WakeIssued(n.NodeID, source)
		case NotifyHanded:
			s.handOff(n.NodeID, n.handoff)
		case NotifyNode:
			s.quiet.forget(n.NodeID)
			s.cache.forget(n.NodeID)
			s.hub.Recheck(n.NodeID, source)
		case NotifyResync:
			s.quiet.forgetAll()
			s.cache.forgetAll()
			s.hub.WakeAll(source)
		case NotifyPeer:
			s.greetedAt.Store(s.now().UnixNano())
			s.store.OthersListening(true)
		}
	}
}

// SetNotifierHealthy records whether cross-replica notifications flow. A
// listener that (re)connects calls it with true after delivering a resync.
func (s *Service) SetNotifierHealthy(ok bool) {
	s.notifierMu.Lock()
	back := ok && !s.notifierHealthy
	s.notifierHealthy = ok
	s.notifierMu.Unlock()
	// Knowledge taken while notifications flowed is void once they may
	// not: a write announced meanwhile would not be heard.
	s.quiet.setHealthy(ok)
	s.cache.setHealthy(ok)
	if back {
		select {
		case s.rewarm <- struct{}{}:
		default: // one is already asked for
		}
	}
}

func (s *Service) notifierOK() bool {
	s.notifierMu.Lock()
	defer s.notifierMu.Unlock()
	return s.notifierHealthy
}

// Run does the background work until ctx ends: warming the node cache
// and due-work memo, coalesced lease renewals, the lease sweeper, and
// publishing this replica's live sessions.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); s.warmLoop(ctx) }()
	go func() { defer wg.Done(); s.leases.run(ctx) }()
	go func() { defer wg.Done(); s.sweepLoop(ctx) }()
	go func() { defer wg.Done(); s.publishLoop(ctx) }()
	wg.Wait()
}

func (s *Service) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.settings.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := s.SweepLeases(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("lease sweep", "err", err)
			}
			// Keep the nodes-by-state counter's log short (the overview
			// sums it); nothing changed folds nothing.
			if err := s.store.FoldNodeCounts(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("fold node counts", "err", err)
			}
		}
	}
}

// SweepLeases marks ready nodes whose lease lapsed as lost, and reports
// them for reconciliation. It answers the nodes it marked.
func (s *Service) SweepLeases(ctx context.Context) ([]string, error) {
	lost, swept, err := s.store.SweepLeases(ctx, s.now())
	if err != nil {
		return nil, err
	}
	if swept {
		s.metrics.LeaseSweeps.Inc()
	}
	for _, id := range lost {
		s.metrics.NodesMarkedLost.Inc()
		s.log.Warn("node lost: lease lapsed without a heartbeat; reconcile it", "node_id", id)
	}
	return lost, nil
}

const sessionsFreshFor = 15 * time.Second

// sessionsRepublish bounds how long a replica goes without rewriting its
// whole session list even when nothing changed.
const sessionsRepublish = time.Minute

// publishLoop keeps this replica's row current: the whole session list when
// a node connected or disconnected (or a minute passed), otherwise only its
// heartbeat, so a large, steady fleet does not rewrite a large document
// every few seconds.
func (s *Service) publishLoop(ctx context.Context) {
	p := &sessionPublisher{started: s.now()}
	t := time.NewTicker(sessionsFreshFor / 3)
	defer t.Stop()
	for {
		now := s.now()
		if err := s.publishSessions(ctx, p, now); err != nil && ctx.Err() == nil {
			s.log.Warn("publish live sessions", "err", err)
		}
		if s.crossReplica {
			s.watchPeers(ctx, now)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sessionPublisher is what publishLoop remembers of its last write.
type sessionPublisher struct {
	started     time.Time
	written     bool // the row holds a list; false rewrites it whole
	version     uint64
	publishedAt time.Time
}

func (s *Service) publishSessions(ctx context.Context, p *sessionPublisher, now time.Time) error {
	// Only other replicas read the published list (LiveSessions answers
	// this one's from the hub). A store no other replica shares (SQLite:
	// one process, DECISIONS.md §23) gets the row without it: SQLite
	// rewrites a row whole, so each heartbeat of a row holding 15,000
	// sessions rewrote the list's ~400 overflow pages and held the one
	// writer for 50–90 ms, every command queued behind it (BENCHMARKS.md,
	// sixteenth sitting).
	var sessions []LiveSession
	var version uint64
	if s.crossReplica {
		sessions, version = s.hub.Sessions(s.settings.ReplicaID)
	}
	if !p.written || version != p.version || now.Sub(p.publishedAt) >= sessionsRepublish {
		if err := s.store.PublishSessions(ctx, s.settings.ReplicaID, p.started, now, sessions); err != nil {
			return err
		}
		p.written, p.version, p.publishedAt = true, version, now
		return nil
	}
	found, err := s.store.TouchReplica(ctx, s.settings.ReplicaID, now)
	if err == nil && !found {
		p.written = false // the row went away (pruned): write it whole next time
	}
	return err
}

// LiveSessions lists the nodes connected now on every replica (holding a
// long-poll, or between two polls): this one's exactly, the others' as they
// last published.
func (s *Service) LiveSessions(ctx context.Context) ([]LiveSession, error) {
	others, err := s.store.ListSessions(ctx, s.now().Add(-sessionsFreshFor))
	if err != nil {
		return nil, err
	}
	out, _ := s.hub.Sessions(s.settings.ReplicaID)
	for _, ls := range others {
		if ls.Replica != s.settings.ReplicaID {
			out = append(out, ls)
		}
	}
	return out, nil
}

// Drain answers every held long-poll with ErrDraining and refuses new ones.
func (s *Service) Drain() { s.hub.Drain() }

func digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func isNoRows(err error) bool { return errors.Is(err, ErrNoRows) }

// clock answers now as stored (dbtime.Norm), so what a call answers equals
// what a later read returns.
func (s *Service) clock() time.Time { return dbtime.Norm(s.now()) }

// NewNodeID mints a node id, as Invite does when the invitation names none
// (callers that must fix the id before inviting, like the ledger, use it).
func NewNodeID() string { return randomID() }

// Now answers the fleet's clock, as it stamps what it stores.
func (s *Service) Now() time.Time { return s.clock() }
