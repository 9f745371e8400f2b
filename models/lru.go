package models

import (
	"container/list"
	"sync"
)

// sizedLRU keeps values named by their own content (a digest, a never
// reused id), so a cached value is never stale, in any database; the
// bound is on bytes, the least recently used going first. Values are
// shared with every caller, who must not change them.
type sizedLRU[V ~string | ~[]byte] struct {
	mu    sync.Mutex // guards the following
	max   int
	size  int
	order *list.List // of *lruEntry[V], most recently used first
	byKey map[string]*list.Element
}

type lruEntry[V ~string | ~[]byte] struct {
	key   string
	value V
}

func newSizedLRU[V ~string | ~[]byte](max int) *sizedLRU[V] {
	return &sizedLRU[V]{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *sizedLRU[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*lruEntry[V]).value, true
}

func (c *sizedLRU[V]) put(key string, value V) {
	if len(value) > c.max/8 {
		return // one value never crowds out the rest
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok {
		c.order.MoveToFront(e)
		return
	}
	c.byKey[key] = c.order.PushFront(&lruEntry[V]{key, value})
	c.size += len(value)
	for c.size > c.max {
		last := c.order.Back()
		ent := last.Value.(*lruEntry[V])
		c.order.Remove(last)
		delete(c.byKey, ent.key)
		c.size -= len(ent.value)
	}
}
