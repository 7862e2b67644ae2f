package grammar

import (
	"container/list"
	"errors"
	"sync"
)

// Cache keeps the Automata of one Vocab by key (a grammar's text, or a JSON Schema's), so that
// requests that use a grammar seen before find its states and masks already built: an agent's
// tool schemas, a service's response format. It holds at most a set number of Automata, each
// with a bounded mask cache, and drops the least recently used first. Safe for concurrent use.
type Cache struct {
	v         *Vocab
	max       int
	maskBytes int

	mu    sync.Mutex
	items map[string]*list.Element
	lru   list.List // of *cacheEntry, most recent first
}

type cacheEntry struct {
	key string
	a   *Automaton
}

// NewCache makes a cache of at most entries Automata over v, each keeping up to maskBytes of
// token masks (as NewAutomaton's maskCache).
func NewCache(v *Vocab, entries, maskBytes int) (*Cache, error) {
	if v == nil || entries < 1 {
		return nil, errors.New("grammar: a cache needs a vocabulary and room for an automaton")
	}
	return &Cache{v: v, max: entries, maskBytes: maskBytes, items: map[string]*list.Element{}}, nil
}

// Vocab is the vocabulary the cache's Automata are built over.
func (c *Cache) Vocab() *Vocab { return c.v }

// Get returns the Automaton cached under key, or builds one from the Grammar that build returns
// and caches it. An error of build is returned as it is, and nothing is cached. Two callers
// asking for a missing key at once may both build; one Automaton is kept.
func (c *Cache) Get(key string, build func() (*Grammar, error)) (*Automaton, error) {
	c.mu.Lock()
	if e, ok := c.items[key]; ok {
		c.lru.MoveToFront(e)
		a := e.Value.(*cacheEntry).a
		c.mu.Unlock()
		return a, nil
	}
	c.mu.Unlock()
	g, err := build()
	if err != nil {
		return nil, err
	}
	a, err := NewAutomaton(g, c.v, c.maskBytes)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cacheEntry).a, nil
	}
	c.items[key] = c.lru.PushFront(&cacheEntry{key, a})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.items, old.Value.(*cacheEntry).key)
	}
	return a, nil
}

// Len is the number of Automata cached.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
