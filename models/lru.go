package models

import (
	"container/list"
	"database/sql"
	"sync"

	"gorm.io/gorm"
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

// readThrough reads the values of keys from table (its key and value
// columns, text) in one statement through g, decoding each and keeping it
// in cache; a key not stored is absent from the answer.
func readThrough[V ~string | ~[]byte](g *gorm.DB, dialect, table, key, value string, keys []string,
	decode func(string) (V, error), cache *sizedLRU[V]) (map[string]V, error) {
	sel := `SELECT ` + key + `, ` + value + ` FROM ` + table + ` WHERE ` + key
	q, args := idsStatement(dialect, sel+` = ANY($1::text[])`, sel+` IN (`, `)`, keys)
	found := make(map[string]V, len(keys))
	err := eachRow(g, q, args, func(rs *sql.Rows) error {
		var k, raw string
		if err := rs.Scan(&k, &raw); err != nil {
			return err
		}
		v, err := decode(raw)
		if err != nil {
			return err
		}
		found[k] = v
		cache.put(k, v)
		return nil
	})
	return found, err
}
