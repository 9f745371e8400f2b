package models

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/nodeward/nodeward/fleet"
)

// NotifySink receives what a Listener hears.
type NotifySink interface {
	Deliver(notes []fleet.Notification, source string)
	SetNotifierHealthy(ok bool)
}

// Listener holds one connection LISTENing on the database's channel and
// hands other replicas' notifications to a sink. While it is disconnected
// the sink is told notifications may be missed (long-polls fall back to
// polling); after every (re)connection it delivers a resync, since what was
// sent meanwhile is lost, and greets the other replicas (fleet.NotifyPeer).
//
// A connection that dies silently (a partition, a failover behind a proxy,
// a NAT forgetting it: no FIN, no RST) would leave a plain wait for a
// notification blocked for good while the sink believes notifications
// flow. So the wait is bounded: after ProbeInterval without a notification
// the connection must answer a probe within ProbeTimeout, or it is dropped
// and re-established (pgx issue #1831).
type Listener struct {
	URL     string
	Channel string
	Replica string
	Sink    NotifySink
	Log     *slog.Logger

	// ProbeInterval is how long the connection may stay silent before it is
	// probed (default 10 s); ProbeTimeout bounds the probe (default 5 s);
	// ConnectTimeout bounds connecting and LISTEN (default 10 s). A dead
	// connection is noticed within ProbeInterval + ProbeTimeout of the last
	// thing it delivered.
	ProbeInterval  time.Duration
	ProbeTimeout   time.Duration
	ConnectTimeout time.Duration
}

// Defaults of the Listener's bounds.
const (
	defaultProbeInterval  = 10 * time.Second
	defaultProbeTimeout   = 5 * time.Second
	defaultConnectTimeout = 10 * time.Second
)

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Run listens until ctx ends, reconnecting with jittered backoff. The
// backoff starts again after a connection that listened for longer than the
// longest backoff, so a replica that lost its connection after hours
// retries at once rather than after the longest wait its earlier failures
// reached, while one that flaps still reconnects at most every 10 s or so.
func (l *Listener) Run(ctx context.Context) {
	const first, longest = 100 * time.Millisecond, 10 * time.Second
	backoff := first
	for ctx.Err() == nil {
		listening, err := l.listenOnce(ctx)
		l.Sink.SetNotifierHealthy(false)
		if ctx.Err() != nil {
			return
		}
		if !listening.IsZero() && time.Since(listening) > longest {
			backoff = first
		}
		// The error may come from parsing or dialing the URL: never echo its
		// password.
		l.Log.Warn("notification listener disconnected; long-polls fall back to polling", "err", redactURLError(err, l.URL), "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, longest)
	}
}

// listenOnce connects, listens and delivers until the connection fails;
// listening is when it started listening (zero if it never did).
func (l *Listener) listenOnce(ctx context.Context) (listening time.Time, err error) {
	cfg, err := pgx.ParseConfig(l.URL)
	if err != nil {
		return time.Time{}, err
	}
	// The bounded wait below must leave the connection usable when it times
	// out: this handler only sets a read deadline on the socket and clears
	// it afterwards (a partly read message is resumed). It is pgx's default
	// today; set here so no change of default turns every quiet interval
	// into a cancel request or a reconnection.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	// Without a bound, connecting through a dead path would hang as long as
	// the path stays dead (the handshake waits for an answer that never
	// comes), and the listener would never try again.
	cctx, cancel := context.WithTimeout(ctx, orDefault(l.ConnectTimeout, defaultConnectTimeout))
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return time.Time{}, err
	}
	defer func() {
		// Bounded too: Close writes a Terminate, which could block on a dead
		// connection whose send buffer is full.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), orDefault(l.ProbeTimeout, defaultProbeTimeout))
		defer cancel()
		_ = conn.Close(ctx)
	}()
	// A replica that believed itself alone, and so sent nothing, starts
	// announcing again once it hears this (fleet.NotifyPeer), after a
	// resync of every replica. Said before listening, so it is not heard
	// here; a resync sent before the LISTEN below is missed, but then the
	// local resync that follows it covers the same commits.
	hello := fleet.Notification{Kind: fleet.NotifyPeer}.Encode(l.Replica)
	if _, err := conn.Exec(cctx, "SELECT pg_notify($1, $2)", l.Channel, hello); err != nil {
		return time.Time{}, err
	}
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{l.Channel}.Sanitize()); err != nil {
		return time.Time{}, err
	}
	cancel()
	listening = time.Now()
	l.Sink.Deliver([]fleet.Notification{{Kind: fleet.NotifyResync}}, "notify")
	l.Sink.SetNotifierHealthy(true)
	every := orDefault(l.ProbeInterval, defaultProbeInterval)
	for {
		n, err := l.wait(ctx, conn, every)
		if err != nil {
			return listening, err
		}
		if n == nil {
			continue // the connection answered a probe
		}
		note, from, err := fleet.DecodeNotification(n.Payload)
		if err != nil {
			l.Log.Warn("ignoring notification", "err", err)
			continue
		}
		if from == l.Replica {
			continue // delivered locally when it committed
		}
		l.Sink.Deliver([]fleet.Notification{note}, "notify")
	}
}

// wait returns the next notification, or nil once the connection has been
// silent for every and then answered a probe. A notification that arrives
// during the probe is kept by pgx and returned by the next wait.
func (l *Listener) wait(ctx context.Context, conn *pgx.Conn, every time.Duration) (*pgconn.Notification, error) {
	wctx, cancel := context.WithTimeout(ctx, every)
	n, err := conn.WaitForNotification(wctx)
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
		return n, err
	}
	timeout := orDefault(l.ProbeTimeout, defaultProbeTimeout)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("connection silent for %s did not answer a probe within %s: %w", every, timeout, err)
	}
	return nil, nil
}
