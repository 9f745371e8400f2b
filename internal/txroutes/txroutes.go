// Package txroutes records the write lane routes (fleet.TxRoute) of the
// transactions a store runs, for tests that wrap a store to see how its
// callers route their writes.
package txroutes

import (
	"context"
	"sync"

	"github.com/nodeward/nodeward/fleet"
)

// Log is the routes noted so far; its zero value is empty and ready.
type Log struct {
	mu     sync.Mutex // guards routes
	routes []fleet.TxRoute
}

// Note records the route ctx carries, if any.
func (l *Log) Note(ctx context.Context) {
	if r, ok := fleet.TxRouteOf(ctx); ok {
		l.mu.Lock()
		l.routes = append(l.routes, r)
		l.mu.Unlock()
	}
}

// Take answers the routes noted since the last Take, and forgets them.
func (l *Log) Take() []fleet.TxRoute {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.routes
	l.routes = nil
	return r
}

// ToNode answers how many routes noted (and not taken) name node.
func (l *Log) ToNode(node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.routes {
		if r.Node == node {
			n++
		}
	}
	return n
}
