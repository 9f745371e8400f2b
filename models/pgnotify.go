package models

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

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
// sent meanwhile is lost.
type Listener struct {
	URL     string
	Channel string
	Replica string
	Sink    NotifySink
	Log     *slog.Logger
}

// Run listens until ctx ends, reconnecting with jittered backoff.
func (l *Listener) Run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listenOnce(ctx)
		l.Sink.SetNotifierHealthy(false)
		if ctx.Err() != nil {
			return
		}
		l.Log.Warn("notification listener disconnected; long-polls fall back to polling", "err", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func (l *Listener) listenOnce(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, l.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.Channel}.Sanitize()); err != nil {
		return err
	}
	l.Sink.Deliver([]fleet.Notification{{Kind: fleet.NotifyResync}}, "notify")
	l.Sink.SetNotifierHealthy(true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
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
