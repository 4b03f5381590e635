package core

import (
	"cmp"
	"context"
	"errors"
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

// TagRanges keeps the tags' ranges for the admin calls (package monotonic's Manager;
// the core writes them to the deployment record too, Config.Record). SetRange
// returns once every dispenser serves the tag with r, and refuses while one of them
// does not know ranges.
type TagRanges interface {
	Ranges
	SetRange(ctx context.Context, tag string, r wire.TagRange) error
}

// errRangesOff answers an admin call that sets a range on a dispenser built without
// tag ranges.
var errRangesOff = fmt.Errorf("%w: opaque tags and tag widths are not configured on this dispenser", wire.ErrUnavailable)

// errMonotonicOff answers an admin call that sets "monotonic" on a dispenser built
// without monotonic tags.
var errMonotonicOff = fmt.Errorf("%w: monotonic tags are not configured on this dispenser", wire.ErrUnavailable)

var errNoAdmin = fmt.Errorf("%w: tag admin is not configured on this dispenser", wire.ErrUnavailable)

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

// TagInfo is a tag as the admin calls show it, with the default range (setRange
// shows another).
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
		Bits:        wire.MaxTagBits,
	}
}

// setRange shows r in info.
func setRange(info *wire.TagInfo, r wire.TagRange) {
	info.Bits, info.Opaque, info.KeyFingerprint = r.Width(), r.Opaque, r.Key
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
	rng, err := c.addedRange(ctx, r, t)
	if err != nil {
		return wire.TagInfo{}, err
	}
	added, err := c.cfg.Tags.AddTag(ctx, t)
	if err != nil {
		return wire.TagInfo{}, fmt.Errorf("add tag %q: %w", r.Tag, err)
	}
	c.log.Info("tag added", "tag", added.Name, "step", added.Step, "max_id", added.MaxID, "range", rng)
	info := TagInfo(added)
	setRange(&info, rng)
	if c.cfg.Monotonic == nil {
		return info, nil
	}
	on := r.Monotonic != nil && *r.Monotonic
	if err := c.setMonotonic(ctx, info.Tag, on); err != nil {
		return wire.TagInfo{}, fmt.Errorf("tag %q was added, but its monotonic mark was not written (retry with tags.update): %w", info.Tag, err)
	}
	info.Monotonic = on
	if on {
		c.log.Info("tag marked monotonic", "tag", info.Tag)
	}
	return info, nil
}

// addedRange is the range of the tag r adds (t, validated), written before the tag
// exists in the store when it is not the default, so that no dispenser ever serves an
// ID of it without the range: an opaque tag's numbers handed out raw could equal the
// images of others. The name must not carry another range (one of an earlier tag of
// that name, whose IDs may have been handed out under it).
func (c *Core) addedRange(ctx context.Context, r wire.AddTagRequest, t segment.Tag) (wire.TagRange, error) {
	var want wire.TagRange
	if r.Bits != nil {
		want.Bits = *r.Bits
	}
	if r.Opaque != nil && *r.Opaque {
		if r.Monotonic != nil && *r.Monotonic {
			return want, wire.BadRequest("tag %q: an opaque tag cannot be monotonic: its IDs are in no order", r.Tag)
		}
		if c.fingerprint() == "" {
			return want, fmt.Errorf("%w: tag %q cannot be added opaque: the dispenser that answered has no ID key (--id-key-file, or LEAFBUS_ID_KEY)", ErrNoKey, r.Tag)
		}
		want.Opaque, want.Key = true, c.cfg.Shaper.Fingerprint()
		if want.Bits == 0 {
			want.Bits = wire.MaxTagBits
		}
	}
	if err := want.Validate(); err != nil {
		return want, wire.BadRequest("tag %q: %v", r.Tag, err)
	}
	want = want.Normal()
	if c.cfg.TagRanges == nil {
		if !want.IsDefault() {
			return want, errRangesOff
		}
		return want, nil
	}
	if t.MaxID > want.Max() {
		return want, wire.BadRequest("tag %q: max_id %d lies beyond its %d-bit range (IDs up to %d)", r.Tag, t.MaxID, want.Width(), want.Max())
	}
	cur, err := c.cfg.TagRanges.TagRange(r.Tag)
	if err != nil {
		return want, fmt.Errorf("add tag %q: %w", r.Tag, err)
	}
	if !cur.IsDefault() && cur != want {
		return want, fmt.Errorf("%w: tag %q: the name carries the range %s of an earlier tag, whose IDs may have been handed out under it; add it with that range, or choose another name",
			wire.ErrConflict, r.Tag, cur)
	}
	if want.IsDefault() {
		return want, nil
	}
	// Set again when the name carries it already (a retried add): SetRange returns only
	// once every dispenser has taken it in, which an earlier attempt may not have seen.
	switch _, err := c.cfg.Tags.Tag(ctx, r.Tag); {
	case err == nil:
		return want, fmt.Errorf("add tag %q: %w", r.Tag, segment.ErrTagExists)
	case errors.Is(err, segment.ErrTagSpelling):
		// The store holds it under another spelling: a 409 like any name taken.
		return want, fmt.Errorf("add tag %q: %w: %v", r.Tag, segment.ErrTagExists, err)
	case !errors.Is(err, segment.ErrTagNotFound):
		return want, fmt.Errorf("add tag %q: %w", r.Tag, err)
	}
	if err := c.setRange(ctx, r.Tag, want); err != nil {
		return want, fmt.Errorf("add tag %q: its range %s was not set, and the tag was not added: %w", r.Tag, want, err)
	}
	c.log.Info("tag range set", "tag", r.Tag, "range", want)
	return want, nil
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
		if c.cfg.TagRanges != nil {
			// As this dispenser serves it: every dispenser took a range in before the
			// call that set it was answered. A tag refused for a range in doubt shows the
			// default here; its requests say why.
			rng, _ := c.cfg.TagRanges.TagRange(t.Name)
			setRange(&info, rng)
		}
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
	if r.Step == nil && r.Description == nil && r.MaxID == nil && r.Monotonic == nil && r.Opaque == nil && r.Bits == nil {
		return wire.TagInfo{}, wire.BadRequest("nothing to update for tag %q: give step, description, max_id, monotonic, opaque and/or bits", r.Tag)
	}
	if r.Monotonic != nil && c.cfg.Monotonic == nil {
		return wire.TagInfo{}, errMonotonicOff
	}
	cur, next, err := c.updatedRange(ctx, r)
	if err != nil {
		return wire.TagInfo{}, err
	}
	var t segment.Tag
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
	setRange(&info, cur)
	if next != cur {
		if err := c.setRange(ctx, t.Name, next); err != nil {
			return wire.TagInfo{}, fmt.Errorf("update tag %q: its range was not changed: %w", r.Tag, err)
		}
		c.log.Info("tag range changed", "tag", t.Name, "from", cur, "to", next)
		setRange(&info, next)
	}
	if err := c.markUpdated(ctx, &info, r.Monotonic); err != nil {
		return wire.TagInfo{}, err
	}
	return info, nil
}

// updatedRange is the tag's range now and after update r, refusing what may not
// change. Whether a tag is opaque, and an opaque tag's width and key, are fixed when it
// is added: its IDs handed out so far could equal IDs of the same numbers shaped
// another way (raw, or under another width or key). The width of a tag that is not
// opaque may change (it caps the numbers, it does not change them); r.Opaque and
// r.Bits may repeat what the tag has.
func (c *Core) updatedRange(ctx context.Context, r wire.UpdateTagRequest) (cur, next wire.TagRange, err error) {
	if c.cfg.TagRanges == nil {
		if r.Opaque != nil && *r.Opaque || r.Bits != nil && *r.Bits != wire.MaxTagBits {
			return cur, next, errRangesOff
		}
		return cur, cur, nil
	}
	if cur, err = c.cfg.TagRanges.TagRange(r.Tag); err != nil {
		return cur, cur, fmt.Errorf("update tag %q: %w", r.Tag, err)
	}
	next = cur
	if r.Bits != nil {
		next.Bits = *r.Bits
	}
	if r.Opaque != nil {
		next.Opaque = *r.Opaque
	}
	switch {
	case next.Opaque != cur.Opaque:
		return cur, cur, wire.BadRequest("tag %q %s: whether a tag is opaque is fixed when it is added, since the IDs it may have handed out could equal IDs it would hand out after the change; add a new tag (--opaque)", r.Tag, map[bool]string{true: "is opaque", false: "is not opaque"}[cur.Opaque])
	case cur.Opaque && r.Bits != nil && *r.Bits != cur.Width():
		return cur, cur, wire.BadRequest("tag %q is opaque with %d bits: an opaque tag's width is part of its permutation and fixed when it is added; add a new tag", r.Tag, cur.Width())
	case cur.Opaque && r.Opaque != nil && c.fingerprint() != cur.Key:
		return cur, cur, fmt.Errorf("%w: tag %q is opaque under the ID key with fingerprint %s, not this dispenser's (%s): changing the key of a tag is refused, since its IDs under the old key could equal IDs under the new one",
			wire.ErrConflict, r.Tag, cur.Key, cmp.Or(c.fingerprint(), "none"))
	case r.Monotonic != nil && *r.Monotonic && cur.Opaque:
		return cur, cur, wire.BadRequest("tag %q: an opaque tag cannot be monotonic: its IDs are in no order", r.Tag)
	}
	if err := next.Validate(); err != nil {
		return cur, cur, wire.BadRequest("tag %q: %v", r.Tag, err)
	}
	next = next.Normal()
	maxID := r.MaxID
	if next.Width() < cur.Width() && maxID == nil {
		t, err := c.cfg.Tags.Tag(ctx, r.Tag)
		if err != nil {
			return cur, cur, fmt.Errorf("update tag %q: %w", r.Tag, err)
		}
		maxID = &t.MaxID
	}
	if maxID != nil && *maxID > next.Max() {
		return cur, cur, wire.BadRequest("tag %q: max_id %d lies beyond %d bits (IDs up to %d): the tag would refuse every ID it has left", r.Tag, *maxID, next.Width(), next.Max())
	}
	return cur, next, nil
}

// fingerprint is this dispenser's ID key's, "" without one.
func (c *Core) fingerprint() string {
	if c.cfg.Shaper == nil {
		return ""
	}
	return c.cfg.Shaper.Fingerprint()
}

// markUpdated writes the mark of an updated tag when want is set, and shows the mark in
// info either way.
func (c *Core) markUpdated(ctx context.Context, info *wire.TagInfo, want *bool) error {
	if c.cfg.Monotonic == nil {
		return nil
	}
	if want != nil {
		if err := c.setMonotonic(ctx, info.Tag, *want); err != nil {
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
