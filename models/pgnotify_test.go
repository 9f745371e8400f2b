package models_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodeward/nodeward/fleet"
	"github.com/nodeward/nodeward/internal/testwait"
	"github.com/nodeward/nodeward/models"
	"github.com/nodeward/nodeward/models/dbtest"
)

// listenSink records what a Listener tells it.
type listenSink struct {
	mu      sync.Mutex
	ok      bool
	ups     int
	downs   int
	resyncs int
	heard   map[string]int // node ID -> deliveries
	kinds   map[fleet.NotificationKind]int
}

func newListenSink() *listenSink {
	return &listenSink{heard: map[string]int{}, kinds: map[fleet.NotificationKind]int{}}
}

func (s *listenSink) Deliver(notes []fleet.Notification, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range notes {
		if n.Kind == fleet.NotifyResync {
			s.resyncs++
			continue
		}
		s.heard[n.NodeID]++
		s.kinds[n.Kind]++
	}
}

// kind answers how many notifications of kind k were heard.
func (s *listenSink) kind(k fleet.NotificationKind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kinds[k]
}

func (s *listenSink) SetNotifierHealthy(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.ups++
	} else if s.ok {
		s.downs++
	}
	s.ok = ok
}

type sinkState struct {
	ok                  bool
	ups, downs, resyncs int
	heard               int // distinct nodes heard
	twice               int // nodes heard more than once
}

func (s *listenSink) state() sinkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := sinkState{ok: s.ok, ups: s.ups, downs: s.downs, resyncs: s.resyncs, heard: len(s.heard)}
	for _, n := range s.heard {
		if n > 1 {
			st.twice++
		}
	}
	return st
}

func (s *listenSink) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heard[id] > 0
}

// syncBuffer is a log destination safe for the listener's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// darkProxy forwards TCP connections to a target until it goes dark: from
// then on every connection it holds, and every one it accepts while dark,
// silently drops whatever either side sends, its sockets left open (no FIN,
// no RST) — a partition, or a NAT that forgot the connections. Connections
// accepted after it is lit again forward normally; the ones cut stay cut.
// It can also hold back what clients send (not drop it) until released.
type darkProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	released *sync.Cond
	dark     bool
	holding  bool
	held     int // reads from clients waiting for a release
	pipes    []*proxyPipe
	accepted int
	fromCli  int // reads from clients forwarded to the target
	toCli    int // bytes from the target forwarded to clients
}

type proxyPipe struct {
	client, server net.Conn
	cut            atomic.Bool
}

func newDarkProxy(t *testing.T, target string) *darkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &darkProxy{ln: ln, target: target}
	p.released = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, pp := range p.pipes {
			_ = pp.client.Close()
			_ = pp.server.Close()
		}
	})
	return p
}

func (p *darkProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pp := &proxyPipe{client: c, server: s}
		p.mu.Lock()
		pp.cut.Store(p.dark)
		p.pipes = append(p.pipes, pp)
		p.accepted++
		p.mu.Unlock()
		go p.copy(pp, c, s, true)
		go p.copy(pp, s, c, false)
	}
}

func (p *darkProxy) copy(pp *proxyPipe, src, dst net.Conn, fromClient bool) {
	defer func() { _ = src.Close(); _ = dst.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pp.cut.Load() {
			p.mu.Lock()
			if fromClient {
				for p.holding {
					p.held++
					p.released.Wait()
				}
				p.fromCli++
			} else {
				p.toCli += n
			}
			p.mu.Unlock()
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *darkProxy) setDark(dark bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dark = dark
	if dark {
		for _, pp := range p.pipes {
			pp.cut.Store(true)
		}
	}
}

func (p *darkProxy) counts() (accepted, fromClients int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.fromCli
}

// hold makes the proxy keep what clients send from now on; release
// forwards it.
func (p *darkProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding, p.held = true, 0
}

func (p *darkProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding = false
	p.released.Broadcast()
}

func (p *darkProxy) holdState() (held, toClients int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.toCli
}

// listenerDB opens a fresh Postgres schema (the Listener is Postgres-only)
// and returns it with a URL of it that connects through proxy.
func listenerDB(t *testing.T) (*models.DB, *darkProxy, string) {
	t.Helper()
	dbtest.Dialects(t) // under CI a missing Postgres fails, never skips
	db := dbtest.Open(t, models.Postgres)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	p := newDarkProxy(t, net.JoinHostPort(u.Hostname(), port))
	u.Host = p.ln.Addr().String()
	return db, p, u.String()
}

func runListener(t *testing.T, l *models.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func sendNotify(t *testing.T, db *models.DB, id string) {
	t.Helper()
	require.NoError(t, db.Exec("SELECT pg_notify(?, ?)", models.NotifyChannel(db),
		fleet.Notification{Kind: fleet.NotifyOperation, NodeID: id}.Encode("other-replica")).Error)
}

// TestListenerNoticesASilentlyDeadConnection (Postgres): quiet probes keep a
// live connection (no reconnection); when the path to the database goes
// dark without closing anything, the sink is told notifications no longer
// flow within a few probe intervals, and once the path is back the listener
// reconnects, delivers a resync and hears notifications again.
func TestListenerNoticesASilentlyDeadConnection(t *testing.T) {
	db, proxy, viaProxy := listenerDB(t)
	sink := newListenSink()
	logs := &syncBuffer{}
	runListener(t, &models.Listener{URL: viaProxy, Channel: models.NotifyChannel(db), Replica: "me", Sink: sink,
		Log: slog.New(slog.NewTextHandler(logs, nil)), ProbeInterval: 100 * time.Millisecond,
		ProbeTimeout: time.Second, ConnectTimeout: 2 * time.Second})
	testwait.For(t, "the listener to connect", testwait.Patience, func() bool { return sink.state().ok })

	// Quiet: the connection is probed again and again, and kept.
	_, sent := proxy.counts()
	testwait.For(t, "five probes", testwait.Patience, func() bool { _, n := proxy.counts(); return n >= sent+5 })
	sendNotify(t, db, "before")
	testwait.For(t, "a notification", testwait.Patience, func() bool { return sink.has("before") })
	accepted, _ := proxy.counts()
	st := sink.state()
	require.Equal(t, 1, accepted, "probes that were answered keep the connection")
	require.Equal(t, sinkState{ok: true, ups: 1, resyncs: 1, heard: 1}, st)

	// Dark: noticed, and reconnecting fails while it lasts.
	proxy.setDark(true)
	testwait.For(t, "the listener to report the dead connection", 10*time.Second, func() bool { return !sink.state().ok })
	testwait.For(t, "a reconnection attempt into the dark", testwait.Patience, func() bool { a, _ := proxy.counts(); return a >= 2 })
	require.Equal(t, 1, sink.state().ups, "no connection while the path is dark")
	require.Contains(t, logs.String(), "did not answer a probe")
	if u, err := url.Parse(viaProxy); err == nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			require.NotContains(t, logs.String(), pw)
		}
	}

	// Lit again: reconnected, resynced, hearing.
	proxy.setDark(false)
	testwait.For(t, "the listener to reconnect", testwait.Patience, func() bool { return sink.state().ok })
	st = sink.state()
	require.Equal(t, 2, st.ups)
	require.Equal(t, 2, st.resyncs, "a resync after reconnecting")
	sendNotify(t, db, "after")
	testwait.For(t, "a notification after reconnecting", testwait.Patience, func() bool { return sink.has("after") })
}

// TestListenerDeliversEveryNotificationWhileProbing (Postgres): with a probe
// every 50 ms, notifications are each delivered exactly once, on the one
// connection, both those sent while the listener waits and those that reach
// it while a probe is in flight (the proxy holds the probe back until they
// have arrived; pgx keeps them for the next wait).
func TestListenerDeliversEveryNotificationWhileProbing(t *testing.T) {
	db, proxy, viaProxy := listenerDB(t)
	sink := newListenSink()
	runListener(t, &models.Listener{URL: viaProxy, Channel: models.NotifyChannel(db), Replica: "me", Sink: sink,
		Log: slog.New(slog.DiscardHandler), ProbeInterval: 50 * time.Millisecond, ProbeTimeout: testwait.Patience})
	testwait.For(t, "the listener to connect", testwait.Patience, func() bool { return sink.state().ok })

	channel := models.NotifyChannel(db)
	const bursts, each = 20, 10
	for b := range bursts {
		ids := make([]string, each)
		for i := range ids {
			ids[i] = fmt.Sprintf("n-%02d-%02d", b, i)
		}
		if b%2 == 0 {
			for _, id := range ids {
				sendNotify(t, db, id)
			}
			_, mark := proxy.counts()
			testwait.For(t, "a probe after the burst", testwait.Patience, func() bool { _, n := proxy.counts(); return n > mark })
			continue
		}
		proxy.hold()
		testwait.For(t, "a probe to hold", testwait.Patience, func() bool { h, _ := proxy.holdState(); return h > 0 })
		_, before := proxy.holdState()
		size := 0
		for _, id := range ids {
			payload := fleet.Notification{Kind: fleet.NotifyOperation, NodeID: id}.Encode("other-replica")
			size += 1 + 4 + 4 + len(channel) + 1 + len(payload) + 1 // NotificationResponse
			sendNotify(t, db, id)
		}
		testwait.For(t, "the burst to reach the probing listener", testwait.Patience, func() bool {
			_, n := proxy.holdState()
			return n >= before+size
		})
		proxy.release()
	}
	testwait.For(t, "every notification", testwait.Patience, func() bool { return sink.state().heard == bursts*each },
		func() string { return fmt.Sprintf("%+v", sink.state()) })
	accepted, _ := proxy.counts()
	require.Equal(t, sinkState{ok: true, ups: 1, resyncs: 1, heard: bursts * each}, sink.state(), "each once, no reconnection")
	require.Equal(t, 1, accepted)
}

// TestAnnouncerReplacesAFailedBatchWithAResync (Postgres): notifications
// the announcer could not send (here a payload over Postgres's 8,000-byte
// limit fails the statement) may never arrive, and their sender is alive,
// so the other replicas are told to resync instead; what is announced
// afterwards arrives as usual.
func TestAnnouncerReplacesAFailedBatchWithAResync(t *testing.T) {
	dbtest.Dialects(t) // under CI a missing Postgres fails, never skips
	db := dbtest.Open(t, models.Postgres)
	sink := newListenSink()
	runListener(t, &models.Listener{URL: db.URL, Channel: models.NotifyChannel(db), Replica: "listener", Sink: sink})
	testwait.For(t, "the listener to listen", testwait.Patience, func() bool { return sink.state().ok })
	resyncs := sink.state().resyncs

	s := models.NewFleetStore(db, "sender", nil)
	tooLong := strings.Repeat("x", 9000)
	models.Announce(s, fleet.Notification{Kind: fleet.NotifyCommands, NodeID: tooLong}.Encode("sender"))
	testwait.For(t, "the resync heard", testwait.Patience, func() bool { return sink.state().resyncs > resyncs })
	require.Equal(t, int64(1), s.AnnounceStats().Failures)
	require.False(t, sink.has(tooLong))

	models.Announce(s, fleet.Notification{Kind: fleet.NotifyCommands, NodeID: "n-after"}.Encode("sender"))
	testwait.For(t, "the next announcement heard", testwait.Patience, func() bool { return sink.has("n-after") })
	require.Equal(t, int64(1), s.AnnounceStats().Failures)
}

// TestAnnouncerAloneUntilAPeerListens (Postgres): a replica that knows no
// other sends no announcement (each would be a transaction only its own
// listener hears); when another appears it first makes every replica
// resync, which covers what it dropped, then announces again; and a
// listener greets the others (fleet.NotifyPeer) each time it connects.
func TestAnnouncerAloneUntilAPeerListens(t *testing.T) {
	dbtest.Dialects(t) // under CI a missing Postgres fails, never skips
	db := dbtest.Open(t, models.Postgres)
	sink := newListenSink()
	runListener(t, &models.Listener{URL: db.URL, Channel: models.NotifyChannel(db), Replica: "listener", Sink: sink})
	testwait.For(t, "the listener to listen", testwait.Patience, func() bool { return sink.state().ok })

	s := models.NewFleetStore(db, "sender", nil)
	note := func(id string) string {
		return fleet.Notification{Kind: fleet.NotifyCommands, NodeID: id}.Encode("sender")
	}

	models.Announce(s, note("n-unknown"))
	testwait.For(t, "announced before anybody looked", testwait.Patience, func() bool { return sink.has("n-unknown") })
	// Counted once the statement returned, which may be after it was heard.
	testwait.For(t, "its statement counted", testwait.Patience, func() bool { return s.AnnounceStats().Statements == 1 })

	s.OthersListening(false)
	resyncs := sink.state().resyncs
	before := s.AnnounceStats()
	models.Announce(s, note("n-alone-1"), note("n-alone-2"))
	after := s.AnnounceStats()
	require.Equal(t, before.Statements, after.Statements, "alone: no statement")
	require.Equal(t, before.Unsent+2, after.Unsent)

	s.OthersListening(true)
	testwait.For(t, "the resync covering what was dropped", testwait.Patience, func() bool { return sink.state().resyncs == resyncs+1 })
	s.OthersListening(true) // already announcing: no second resync
	models.Announce(s, note("n-back"))
	testwait.For(t, "announced again", testwait.Patience, func() bool { return sink.has("n-back") })
	require.Equal(t, resyncs+1, sink.state().resyncs)
	require.False(t, sink.has("n-alone-1"), "dropped, not sent late")
	require.Equal(t, after.Unsent, s.AnnounceStats().Unsent)

	greetings := sink.kind(fleet.NotifyPeer)
	other := newListenSink()
	runListener(t, &models.Listener{URL: db.URL, Channel: models.NotifyChannel(db), Replica: "newcomer", Sink: other})
	testwait.For(t, "the newcomer's greeting", testwait.Patience, func() bool { return sink.kind(fleet.NotifyPeer) == greetings+1 })
	require.Zero(t, other.kind(fleet.NotifyPeer), "a listener does not hear its own greeting")
}
