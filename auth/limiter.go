package auth

import (
	"container/list"
	"crypto/sha256"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// defaultLimiterKeys bounds the login limiter: about 100 bytes a key, so
// at most a few MB however many usernames and clients are tried.
const defaultLimiterKeys = 20000

// limiterKeyOf is the limiter's key: a digest of the lower-cased username
// and the client's host, so the submitted text never lives in memory.
type limiterKeyOf [16]byte

// limiterKey returns the key of a login attempt by username from host.
func limiterKey(username, host string) limiterKeyOf {
	sum := sha256.Sum256([]byte(strings.ToLower(username) + "\x00" + clientNetwork(host)))
	var k limiterKeyOf
	copy(k[:], sum[:])
	return k
}

// clientNetwork is what the limiter counts one client by: its IPv4
// address, or its IPv6 /64 (one subscriber's network, whose addresses it
// may change at will).
func clientNetwork(host string) string {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if a = a.Unmap(); a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// loginLimiter refuses logins for a key (username and client address) after
// max failures inside window. In memory: a replica restart forgives, which
// is acceptable for a brake on guessing, not an account lock.
//
// It holds at most maxKeys keys: beyond that the least recently failed key
// is forgotten, and a sweep once a window drops keys whose failures have
// all expired. Forgetting lets a key guess again early; that costs an
// attacker maxKeys fresh failures (each a full password hash) first.
type loginLimiter struct {
	max     int
	window  time.Duration
	maxKeys int

	mu        sync.Mutex // guards the following
	keys      map[limiterKeyOf]*list.Element
	lru       *list.List // of *limiterEntry, most recently failed first
	lastSweep time.Time
	// pending counts each key's tries being judged now (reserve); a key
	// is here only while one is, so it holds at most the requests in
	// flight.
	pending map[limiterKeyOf]int
}

type limiterEntry struct {
	key limiterKeyOf
	// failures are the latest failure times, oldest first, at most max.
	failures []time.Time
}

func newLoginLimiter(max int, window time.Duration, maxKeys int) *loginLimiter {
	return &loginLimiter{max: max, window: window, maxKeys: maxKeys,
		keys: map[limiterKeyOf]*list.Element{}, lru: list.New(), pending: map[limiterKeyOf]int{}}
}

// recentLocked answers the key's failures inside the window, dropping the
// key when none are.
func (l *loginLimiter) recentLocked(key limiterKeyOf, now time.Time) *limiterEntry {
	el, ok := l.keys[key]
	if !ok {
		return nil
	}
	e := el.Value.(*limiterEntry)
	kept := e.failures[:0]
	for _, t := range e.failures {
		if now.Sub(t) < l.window {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		l.removeLocked(el)
		return nil
	}
	e.failures = kept
	return e
}

func (l *loginLimiter) removeLocked(el *list.Element) {
	delete(l.keys, el.Value.(*limiterEntry).key)
	l.lru.Remove(el)
}

// sweepLocked drops every key whose failures have all expired, at most
// once a window: keys that are never tried again do not stay.
func (l *loginLimiter) sweepLocked(now time.Time) {
	if now.Sub(l.lastSweep) < l.window {
		return
	}
	l.lastSweep = now
	for el := l.lru.Back(); el != nil; {
		prev := el.Prev()
		e := el.Value.(*limiterEntry)
		if now.Sub(e.failures[len(e.failures)-1]) >= l.window {
			l.removeLocked(el)
		}
		el = prev
	}
}

// reserve takes a try for key, or answers false when its failures inside
// the window and the tries being judged now reach max. Counting a try
// before its password is hashed is what bounds guesses sent in parallel:
// checked one by one, a burst would all pass before any failed. Every
// reserved try ends in exactly one of fail, reset or release.
func (l *loginLimiter) reserve(key limiterKeyOf, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.pending[key]
	if e := l.recentLocked(key, now); e != nil {
		n += len(e.failures)
	}
	if n >= l.max {
		return false
	}
	l.pending[key]++
	return true
}

// release ends a reserved try that was not judged (shed, abandoned, a
// store error).
func (l *loginLimiter) release(key limiterKeyOf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(key)
}

func (l *loginLimiter) releaseLocked(key limiterKeyOf) {
	if l.pending[key] <= 1 {
		delete(l.pending, key)
		return
	}
	l.pending[key]--
}

// fail ends a reserved try as a failure.
func (l *loginLimiter) fail(key limiterKeyOf, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(key)
	l.sweepLocked(now)
	e := l.recentLocked(key, now)
	if e == nil {
		for l.lru.Len() >= l.maxKeys {
			l.removeLocked(l.lru.Back())
		}
		e = &limiterEntry{key: key}
		l.keys[key] = l.lru.PushFront(e)
	} else {
		l.lru.MoveToFront(l.keys[key])
	}
	e.failures = append(e.failures, now)
	if len(e.failures) > l.max {
		e.failures = e.failures[len(e.failures)-l.max:]
	}
}

// reset ends a reserved try as a success: the key's failures are
// forgiven.
func (l *loginLimiter) reset(key limiterKeyOf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(key)
	if el, ok := l.keys[key]; ok {
		l.removeLocked(el)
	}
}

// size answers how many keys the limiter holds.
func (l *loginLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}
