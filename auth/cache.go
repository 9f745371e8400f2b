package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The credential cache keeps, per replica, the principals of Bearer tokens
// and console cookies this replica verified against the store, so a busy
// script or package host does not cost a database read per request.
//
//   - Keyed by the SHA-256 of the credential, never the credential itself.
//   - Only verified credentials enter it: a forged, unknown or revoked one
//     is read from the store every time and never cached, so a flood of
//     random tokens neither grows the cache nor evicts anybody.
//   - Bounded: at most CacheSize entries; when it is full of live entries
//     a newly verified credential is simply not cached (it still works).
//   - Short-lived: an entry is trusted for at most CacheTTL after the read
//     that verified it (and never past a console session's own expiry).
//   - Dropped at once when this replica commits a revocation (API token
//     revoke, package host revoke or new token, console logout), and when
//     another replica's revocation is heard (NOTIFY on Postgres,
//     DECISIONS.md §7). While the listener is disconnected the cache is off
//     and empty, and a reconnection empties it again (resync). A
//     notification lost without the connection being seen to drop leaves
//     a revoked credential working for at most CacheTTL after its
//     revocation: the entry was verified before the revocation and lives
//     at most CacheTTL; no read after the revocation can cache it again.
//   - A read that started before a revocation was forgotten is never
//     cached after it (the epoch, as in fleet's node cache).
//   - Concurrent misses of one credential share one store read (a busy
//     script's 64 requests when its entry expires cost one read, and one
//     last-used stamp, not 64 contending on its row), but only a read that
//     started in the same epoch: a request after a revocation never takes
//     the answer of a read from before it.

// DefaultCacheTTL is how long a verified credential is trusted without
// asking the store again: the bound on a revoked credential's life on a
// replica that missed the revocation's notification.
const DefaultCacheTTL = 5 * time.Second

// DefaultCacheSize bounds the cached credentials per replica.
const DefaultCacheSize = 4096

// Subjects name what a revocation invalidates: every cached credential of
// that API token, package host (all its tokens), console session or
// administrator (all their tokens and sessions).
const (
	subjectToken   = "t:"
	subjectHost    = "h:"
	subjectSession = "s:"
	subjectUser    = "u:"
)

// TokenSubject, HostSubject, SessionSubject and UserSubject name the
// cache subject of an API token, a package host, a console session and an
// administrator (what Store.AnnounceRevoked carries to the other
// replicas).
func TokenSubject(id string) string   { return subjectToken + id }
func HostSubject(id string) string    { return subjectHost + id }
func SessionSubject(id string) string { return subjectSession + id }
func UserSubject(id string) string    { return subjectUser + id }

// CacheStats are the credential cache's counters since the start.
type CacheStats struct {
	// Hits are authentications answered from the cache (no store read).
	Hits int64
	// StoreReads are authentications that read the store (a miss, an
	// unknown or revoked credential, or the cache off).
	StoreReads int64
	// Shared are authentications answered by a concurrent request's store
	// read of the same credential.
	Shared int64
	// Invalidations are revocations applied: by source ("local": this
	// replica's commit; "notify": another replica's; "resync": the whole
	// cache dropped because notifications may have been missed).
	Invalidations map[string]int64
	// Entries is how many credentials are cached now.
	Entries int
	// Enabled is false while cross-replica notifications do not flow.
	Enabled bool
}

type cacheKey [sha256.Size]byte

type cacheEntry struct {
	p       Principal
	subject string
	// user is the administrator's subject (UserSubject) for their tokens
	// and sessions: disabling them forgets every one.
	user string
	// until is when the entry stops being trusted (verified + TTL, or the
	// session's expiry if sooner).
	until time.Time
	// lastUsed is the API token's last-used stamp as last read or written,
	// so the stamp stays coalesced (one write a minute) on cache hits.
	lastUsed time.Time
}

type credCache struct {
	ttl  time.Duration
	size int

	mu      sync.Mutex // guards the following
	entries map[cacheKey]*cacheEntry
	flights map[cacheKey]*flight
	epoch   uint64
	enabled bool

	hits, reads, shared            atomic.Int64
	invLocal, invNotify, invResync atomic.Int64
}

func newCredCache(ttl time.Duration, size int, enabled bool) *credCache {
	return &credCache{ttl: ttl, size: size, entries: map[cacheKey]*cacheEntry{}, flights: map[cacheKey]*flight{}, enabled: enabled}
}

var errUnfinished = errors.New("auth: the shared credential read did not finish")

// flight is one store read of a credential, shared by the misses of it
// that arrive while it runs in the same epoch.
type flight struct {
	epoch   uint64
	waiters int // guarded by credCache.mu
	done    chan struct{}
	p       Principal
	err     error
}

func keyOf(credential string) cacheKey { return sha256.Sum256([]byte(credential)) }

// get answers the live entry of k (a copy), counting a hit.
func (c *credCache) get(k cacheKey, now time.Time) (cacheEntry, bool) {
	if c.ttl <= 0 {
		return cacheEntry{}, false
	}
	c.mu.Lock()
	e, ok := c.entries[k]
	if ok && !now.Before(e.until) {
		delete(c.entries, k)
		ok = false
	}
	var out cacheEntry
	if ok {
		out = *e
	}
	c.mu.Unlock()
	if ok {
		c.hits.Add(1)
	}
	return out, ok
}

// read answers k's principal by one call of load, shared with concurrent
// callers for k whose epoch is the same (while the cache is on: off, every
// request reads the store itself). load gets the epoch to pass to
// put. A caller's wait ends with its own ctx; a shared read that ended
// because its first caller's context did is not taken by the others: they
// take the cache's entry if one appeared meanwhile, else read again
// (sharing that read).
func (c *credCache) read(ctx context.Context, k cacheKey, now time.Time, load func(ctx context.Context, epoch uint64) (Principal, error)) (Principal, error) {
	for again := false; ; again = true {
		c.mu.Lock()
		if e, ok := c.entries[k]; again && ok && now.Before(e.until) {
			// Cached by whoever read after the abandoned read.
			p := e.p
			c.mu.Unlock()
			c.hits.Add(1)
			return p, nil
		}
		if f, ok := c.flights[k]; ok && f.epoch == c.epoch && c.enabled && c.ttl > 0 {
			f.waiters++
			c.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return Principal{}, ctx.Err()
			}
			if (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) && ctx.Err() == nil {
				continue
			}
			c.shared.Add(1)
			return f.p, f.err
		}
		// errUnfinished stands until load answers, so a load that panics
		// lets nobody in.
		f := &flight{epoch: c.epoch, done: make(chan struct{}), err: errUnfinished}
		c.flights[k] = f
		c.mu.Unlock()
		c.reads.Add(1)
		defer func() {
			c.mu.Lock()
			if c.flights[k] == f {
				delete(c.flights, k)
			}
			c.mu.Unlock()
			close(f.done)
		}()
		f.p, f.err = load(ctx, f.epoch)
		return f.p, f.err
	}
}

// put caches a verified credential read since epoch, unless something was
// forgotten meanwhile, the cache is off, or it is full of live entries.
// expires is the credential's own end (zero: none).
func (c *credCache) put(k cacheKey, e cacheEntry, epoch uint64, now, expires time.Time) {
	if c.ttl <= 0 || c.size <= 0 {
		return
	}
	e.until = now.Add(c.ttl)
	if !expires.IsZero() && expires.Before(e.until) {
		e.until = expires
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || c.epoch != epoch {
		return
	}
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.size {
		for key, old := range c.entries {
			if !now.Before(old.until) {
				delete(c.entries, key)
			}
		}
		if len(c.entries) >= c.size {
			return
		}
	}
	c.entries[k] = &e
}

// claimTouch answers whether this request should write the API token's
// last-used stamp (at most once per resolution per cached entry): the first
// caller past the resolution claims it for everyone.
func (c *credCache) claimTouch(k cacheKey, now time.Time, resolution time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok {
		return true // evicted meanwhile: stamp as an uncached read would
	}
	if now.Sub(e.lastUsed) < resolution {
		return false
	}
	e.lastUsed = now
	return true
}

// forget drops every entry of subject.
func (c *credCache) forget(subject, source string) {
	c.mu.Lock()
	for k, e := range c.entries {
		if e.subject == subject || (e.user != "" && e.user == subject) {
			delete(c.entries, k)
		}
	}
	c.epoch++
	c.mu.Unlock()
	if source == "local" {
		c.invLocal.Add(1)
	} else {
		c.invNotify.Add(1)
	}
}

// forgetAll drops everything.
func (c *credCache) forgetAll() {
	c.mu.Lock()
	c.entries = map[cacheKey]*cacheEntry{}
	c.epoch++
	c.mu.Unlock()
	c.invResync.Add(1)
}

// setEnabled turns the cache on or off; either way it starts empty.
func (c *credCache) setEnabled(ok bool) {
	c.mu.Lock()
	c.enabled = ok
	c.entries = map[cacheKey]*cacheEntry{}
	c.epoch++
	c.mu.Unlock()
	if !ok {
		c.invResync.Add(1)
	}
}

func (c *credCache) stats() CacheStats {
	c.mu.Lock()
	n, on := len(c.entries), c.enabled
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), StoreReads: c.reads.Load(), Shared: c.shared.Load(), Entries: n, Enabled: on,
		Invalidations: map[string]int64{"local": c.invLocal.Load(), "notify": c.invNotify.Load(), "resync": c.invResync.Load()}}
}

// CacheStats answers the credential cache's counters.
func (s *Service) CacheStats() CacheStats { return s.cache.stats() }

// CredentialsChanged applies a revocation announced for subject (see
// TokenSubject): by this replica's commit (source "local") or another
// replica's (source "notify"). Unknown subjects are ignored.
func (s *Service) CredentialsChanged(subject, source string) {
	known := false
	for _, prefix := range []string{subjectToken, subjectHost, subjectSession, subjectUser} {
		known = known || strings.HasPrefix(subject, prefix)
	}
	if !known {
		return
	}
	s.cache.forget(subject, source)
}

// Resync drops every cached credential: notifications may have been
// missed (the listener reconnected).
func (s *Service) Resync() { s.cache.forgetAll() }

// SetNotifierHealthy turns the cache off (and empties it) while
// cross-replica notifications do not flow, and back on when they do again.
// A service built without CrossReplica ignores it.
func (s *Service) SetNotifierHealthy(ok bool) {
	if !s.crossReplica {
		return
	}
	s.cache.setEnabled(ok)
}
