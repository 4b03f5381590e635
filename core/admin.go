package core

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// TagStore is where the admin calls manage segment tags (segment.Store).
type TagStore interface {
	Tags(ctx context.Context) ([]segment.Tag, error)
	Tag(ctx context.Context, name string) (segment.Tag, error)
	AddTag(ctx context.Context, t segment.Tag) (segment.Tag, error)
	UpdateTag(ctx context.Context, u segment.TagUpdate) (segment.Tag, error)
}

// errMonotonicOff answers an admin call that sets "monotonic" on a dispenser built
// without monotonic tags.
var errMonotonicOff = fmt.Errorf("%w: monotonic tags are not configured on this dispenser", wire.ErrUnavailable)

var errNoAdmin = fmt.Errorf("%w: tag admin is not configured on this dispenser", wire.ErrUnavailable)

// markable reports whether tag can carry a monotonic mark: package monotonic keeps
// marks and leases under the tag as it stands in a KV key and a header, so only a
// plain tag (A-Z a-z 0-9 _ -, protocol v1's names) can be marked for now. Another tag
// has no mark, is never monotonic, and asking to mark it is a 400.
func markable(tag string) bool { return wire.IsPlainTag(tag) }

// checkMarkable refuses to mark a tag that cannot carry a mark.
func checkMarkable(tag string, want *bool) error {
	if want != nil && *want && !markable(tag) {
		return wire.BadRequest("tag %s cannot be marked monotonic: only tags of A-Z a-z 0-9 _ - can be, for now", wire.Quote(tag))
	}
	return nil
}

// Admin runs call on a goroutine of its own with a context bounded by AdminTimeout, as
// a waiting request (an admin call is a store round trip, which must not hold up a
// face's delivery). It returns the refusal to answer instead when call may not start:
// MaxWaiting requests already wait, the core is stopping, or it has no tag store.
func (c *Core) Admin(call func(ctx context.Context)) error {
	if c.cfg.Tags == nil {
		return errNoAdmin
	}
	if err := c.startWaiter(); err != nil {
		return err
	}
	go func() {
		defer c.endWaiter()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.AdminTimeout)
		defer cancel()
		call(ctx)
	}()
	return nil
}

// TagInfo is a tag as the admin calls show it.
func TagInfo(t segment.Tag) wire.TagInfo {
	var ut string
	if !t.UpdateTime.IsZero() {
		ut = t.UpdateTime.UTC().Format(time.RFC3339)
	}
	return wire.TagInfo{
		Tag:         t.Name,
		MaxID:       t.MaxID,
		MaxIDStr:    strconv.FormatInt(t.MaxID, 10),
		Step:        t.Step,
		Description: t.Description,
		UpdateTime:  ut,
	}
}

// AddTag adds a tag (leaf.admin.tags.add), and writes its monotonic mark: false unless
// asked, so that a stale mark of an earlier tag of that name does not carry over.
func (c *Core) AddTag(ctx context.Context, r wire.AddTagRequest) (wire.TagInfo, error) {
	if r.Step == nil {
		return wire.TagInfo{}, wire.BadRequest("step is required (1 to %d)", segment.MaxStoredStep)
	}
	t := segment.Tag{Name: r.Tag, Step: *r.Step, MaxID: 1}
	if r.MaxID != nil {
		t.MaxID = *r.MaxID
	}
	if r.Description != nil {
		t.Description = *r.Description
	}
	if err := t.Validate(); err != nil {
		return wire.TagInfo{}, err
	}
	if r.Monotonic != nil && *r.Monotonic && c.cfg.Monotonic == nil {
		return wire.TagInfo{}, errMonotonicOff
	}
	if err := checkMarkable(r.Tag, r.Monotonic); err != nil {
		return wire.TagInfo{}, err
	}
	added, err := c.cfg.Tags.AddTag(ctx, t)
	if err != nil {
		return wire.TagInfo{}, fmt.Errorf("add tag %q: %w", r.Tag, err)
	}
	c.log.Info("tag added", "tag", added.Name, "step", added.Step, "max_id", added.MaxID)
	info := TagInfo(added)
	if c.cfg.Monotonic == nil || !markable(info.Tag) {
		return info, nil
	}
	on := r.Monotonic != nil && *r.Monotonic
	if err := c.cfg.Monotonic.SetMonotonic(ctx, info.Tag, on); err != nil {
		return wire.TagInfo{}, fmt.Errorf("tag %q was added, but its monotonic mark was not written (retry with tags.update): %w", info.Tag, err)
	}
	info.Monotonic = on
	if on {
		c.log.Info("tag marked monotonic", "tag", info.Tag)
	}
	return info, nil
}

// ListTags lists every tag with its monotonic mark (leaf.admin.tags.list).
func (c *Core) ListTags(ctx context.Context) ([]wire.TagInfo, error) {
	tags, err := c.cfg.Tags.Tags(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	var marks map[string]bool
	if c.cfg.Monotonic != nil {
		if marks, err = c.cfg.Monotonic.MonotonicTags(ctx); err != nil {
			return nil, fmt.Errorf("list tags: read the monotonic marks: %w", err)
		}
	}
	out := make([]wire.TagInfo, 0, len(tags))
	for _, t := range tags {
		info := TagInfo(t)
		info.Monotonic = marks[t.Name]
		out = append(out, info)
	}
	return out, nil
}

// UpdateTag changes a tag's step, description, max_id and/or monotonic mark
// (leaf.admin.tags.update).
func (c *Core) UpdateTag(ctx context.Context, r wire.UpdateTagRequest) (wire.TagInfo, error) {
	if err := segment.CheckTagName(r.Tag); err != nil {
		return wire.TagInfo{}, err
	}
	if r.Step == nil && r.Description == nil && r.MaxID == nil && r.Monotonic == nil {
		return wire.TagInfo{}, wire.BadRequest("nothing to update for tag %q: give step, description, max_id and/or monotonic", r.Tag)
	}
	if r.Monotonic != nil && c.cfg.Monotonic == nil {
		return wire.TagInfo{}, errMonotonicOff
	}
	if err := checkMarkable(r.Tag, r.Monotonic); err != nil {
		return wire.TagInfo{}, err
	}
	var t segment.Tag
	var err error
	if r.Step == nil && r.Description == nil && r.MaxID == nil {
		t, err = c.cfg.Tags.Tag(ctx, r.Tag) // only the mark changes
	} else {
		u := segment.TagUpdate{Name: r.Tag, Step: r.Step, Description: r.Description, MaxID: r.MaxID}
		if err := u.Validate(); err != nil {
			return wire.TagInfo{}, err
		}
		if t, err = c.cfg.Tags.UpdateTag(ctx, u); err == nil {
			if r.MaxID != nil {
				c.log.Warn("tag max_id raised by an operator", "tag", t.Name, "max_id", t.MaxID)
			}
			c.log.Info("tag updated", "tag", t.Name, "step", t.Step)
		}
	}
	if err != nil {
		return wire.TagInfo{}, fmt.Errorf("update tag %q: %w", r.Tag, err)
	}
	info := TagInfo(t)
	if err := c.markUpdated(ctx, &info, r.Monotonic); err != nil {
		return wire.TagInfo{}, err
	}
	return info, nil
}

// markUpdated writes the mark of an updated tag when want is set, and shows the mark in
// info either way.
func (c *Core) markUpdated(ctx context.Context, info *wire.TagInfo, want *bool) error {
	if c.cfg.Monotonic == nil || !markable(info.Tag) {
		return nil
	}
	if want != nil {
		if err := c.cfg.Monotonic.SetMonotonic(ctx, info.Tag, *want); err != nil {
			return fmt.Errorf("update tag %q: %w", info.Tag, err)
		}
		info.Monotonic = *want
		c.log.Info("tag monotonic mark updated", "tag", info.Tag, "monotonic", *want)
		return nil
	}
	marks, err := c.cfg.Monotonic.MonotonicTags(ctx)
	if err != nil {
		return fmt.Errorf("read the monotonic mark of tag %q: %w", info.Tag, err)
	}
	info.Monotonic = marks[info.Tag]
	return nil
}
