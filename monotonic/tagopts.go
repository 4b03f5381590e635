package monotonic

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// tagOptions is the value of a key of <prefix>_tagopts: the options of one segment
// tag that Leaf's leaf_alloc has no column for.
type tagOptions struct {
	Monotonic bool `json:"monotonic"`
}

// markSet is the tags marked monotonic as this dispenser last saw them, by exact name
// and, on a store that compares tags without case (MySQL's biz_tag: "Orders" and
// "orders" are one row, one range of IDs), by lower-case name. Never changed once
// published.
type markSet struct {
	fold   bool // the store compares tag names without case (Config.FoldCase)
	exact  map[string]bool
	folded map[string]string // lower case -> the marked name; empty unless fold
}

// lookup says whether tag is marked. A tag that is not marked but differs only in case
// from one that is could be the same row of a MySQL store: it is refused, since
// serving it as an ordinary tag would hand out IDs of the marked tag out of order.
func (s *markSet) lookup(tag string) (bool, error) {
	if s.exact[tag] {
		return true, nil
	}
	if len(s.folded) == 0 || len(tag) > wire.MaxTagLen {
		return false, nil
	}
	var buf [wire.MaxTagLen]byte
	lower := buf[:len(tag)]
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	if marked, ok := s.folded[string(lower)]; ok {
		return false, wire.BadRequest("tag %q differs only in case from the monotonic tag %q, which may be the same row of the segment store: ask for %q", tag, marked, marked)
	}
	return false, nil
}

func (s *markSet) with(tag string, on bool) *markSet {
	next := &markSet{fold: s.fold, exact: make(map[string]bool, len(s.exact)+1), folded: make(map[string]string, len(s.folded)+1)}
	for t := range s.exact {
		if t != tag {
			next.add(t)
		}
	}
	if on {
		next.add(tag)
	}
	return next
}

func (s *markSet) add(tag string) {
	s.exact[tag] = true
	if s.fold {
		s.folded[strings.ToLower(tag)] = tag
	}
}

// decodeOptions reads a <prefix>_tagopts value. A value it cannot read counts as
// monotonic: the stronger promise is the safe side of a doubt.
func decodeOptions(logger *slog.Logger, key string, value []byte) tagOptions {
	var o tagOptions
	if err := json.Unmarshal(value, &o); err != nil {
		logger.Error("monotonic: unreadable tag options; the tag is served as monotonic until they are rewritten", "tag", key, "value", string(value), "err", err)
		return tagOptions{Monotonic: true}
	}
	return o
}

// SetMonotonic marks tag monotonic or ordinary in <prefix>_tagopts; every dispenser
// sees it through its watch. tag must be the name as the store keeps it.
func (m *Manager) SetMonotonic(ctx context.Context, tag string, on bool) error {
	if err := segment.CheckTagName(tag); err != nil {
		return err
	}
	b, err := json.Marshal(tagOptions{Monotonic: on})
	if err != nil {
		return fmt.Errorf("monotonic: encode options of tag %q: %w", tag, err)
	}
	if _, err := m.opts.Put(ctx, tag, b); err != nil {
		return fmt.Errorf("%w: monotonic: write the options of tag %q to %s: %w", wire.ErrUnavailable, tag, m.opts.Bucket(), err)
	}
	m.log.Info("monotonic: tag mark written", "tag", tag, "monotonic", on)
	return nil
}

// MonotonicTags reads every mark from <prefix>_tagopts (not this dispenser's view,
// which may lag a write another dispenser just made): the tags marked monotonic. The
// listing is complete (kvbucket.List): a marked tag is never left out.
func (m *Manager) MonotonicTags(ctx context.Context) (map[string]bool, error) {
	entries, err := kvbucket.List(ctx, m.cfg.JetStream, m.opts)
	if err != nil {
		return nil, fmt.Errorf("%w: monotonic: read %s: %w", wire.ErrUnavailable, m.opts.Bucket(), err)
	}
	out := map[string]bool{}
	for key, e := range entries {
		if decodeOptions(m.log, key, e.Value()).Monotonic {
			out[key] = true
		}
	}
	return out, nil
}
