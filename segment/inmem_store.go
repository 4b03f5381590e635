package segment

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// InmemStore is a Store in memory, for tests only: nothing survives the process and
// nothing is shared with another. It behaves like the real stores (it passes the same
// conformance suite and really hands out disjoint ranges) and is safe for concurrent use.
type InmemStore struct {
	mu   sync.Mutex
	tags map[string]Tag
}

var _ Store = (*InmemStore)(nil)

// NewInmemStore returns an empty store.
func NewInmemStore() *InmemStore {
	return &InmemStore{tags: make(map[string]Tag)}
}

// Take implements Store.
func (s *InmemStore) Take(ctx context.Context, tag string, step int64) (Tag, error) {
	if err := checkTake(tag, step); err != nil {
		return Tag{}, err
	}
	if err := ctx.Err(); err != nil {
		return Tag{}, fmt.Errorf("segment: inmem take %q: %w", tag, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tags[tag]
	if !ok {
		return Tag{}, fmt.Errorf("segment: inmem take %q: %w", tag, ErrTagNotFound)
	}
	t, err := advance(t, step)
	if err != nil {
		return Tag{}, fmt.Errorf("segment: inmem take: %w", err)
	}
	t.UpdateTime = storeNow()
	s.tags[tag] = t
	return t, nil
}

// Tag implements Store.
func (s *InmemStore) Tag(ctx context.Context, tag string) (Tag, error) {
	if err := CheckTagName(tag); err != nil {
		return Tag{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tags[tag]
	if !ok {
		return Tag{}, fmt.Errorf("segment: inmem tag %q: %w", tag, ErrTagNotFound)
	}
	return t, nil
}

// Tags implements Store.
func (s *InmemStore) Tags(ctx context.Context) ([]Tag, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := make([]Tag, 0, len(s.tags))
	for _, t := range s.tags {
		list = append(list, t)
	}
	slices.SortFunc(list, func(a, b Tag) int { return strings.Compare(a.Name, b.Name) })
	return list, nil
}

// AddTag implements Store.
func (s *InmemStore) AddTag(ctx context.Context, t Tag) (Tag, error) {
	if t.MaxID == 0 {
		t.MaxID = 1
	}
	if err := t.Validate(); err != nil {
		return Tag{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tags[t.Name]; ok {
		return Tag{}, fmt.Errorf("segment: inmem add %q: %w", t.Name, ErrTagExists)
	}
	t.UpdateTime = storeNow()
	s.tags[t.Name] = t
	return t, nil
}

// UpdateTag implements Store.
func (s *InmemStore) UpdateTag(ctx context.Context, u TagUpdate) (Tag, error) {
	if err := u.Validate(); err != nil {
		return Tag{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tags[u.Name]
	if !ok {
		return Tag{}, fmt.Errorf("segment: inmem update %q: %w", u.Name, ErrTagNotFound)
	}
	t, err := u.apply(t)
	if err != nil {
		return Tag{}, fmt.Errorf("segment: inmem update: %w", err)
	}
	t.UpdateTime = storeNow()
	s.tags[u.Name] = t
	return t, nil
}

// storeNow is the update_time the stores record: UTC whole seconds, like MySQL's
// TIMESTAMP column and the RFC 3339 text the KV store keeps, so every store returns the
// same value it would read back.
func storeNow() time.Time {
	return time.Now().UTC().Truncate(time.Second)
}
