package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

func tagInfo(t segment.Tag) wire.TagInfo {
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

// admin wraps an admin call: it runs on its own goroutine (it is a store round trip,
// which must not hold up the delivery goroutine), bounded by AdminTimeout, and answers
// JSON or an error through the reply subject.
func (s *Service) admin(call func(ctx context.Context, body []byte) (any, error)) handler {
	return func(e *endpoint, m *nats.Msg, _ time.Duration) outcome {
		if s.cfg.Tags == nil {
			s.fail(e, m, nil, fmt.Errorf("%w: tag admin is not configured on this dispenser", wire.ErrUnavailable))
			return outcome{} // admin calls are not observed
		}
		if err := s.startWaiter(); err != nil {
			s.fail(e, m, nil, err)
			return outcome{}
		}
		// nats.go gives every delivered message its own copy of the payload, so the body
		// may be read after the handler returns.
		body, reply, subject := m.Data, m.Reply, m.Subject
		go func() {
			defer s.endWaiter()
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AdminTimeout)
			defer cancel()
			v, err := call(ctx, body)
			var b []byte
			if err == nil {
				b, err = json.Marshal(v)
			}
			if err != nil {
				code, desc := s.describe(subject, nil, err)
				s.replyError(e, subject, reply, code, desc)
				return
			}
			s.reply(e, subject, reply, b)
		}()
		return outcome{}
	}
}

// decodeStrict reads one JSON object, refusing unknown fields (a typo such as "stpe"
// must not silently do nothing) and trailing data.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return wire.BadRequest("empty body: want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return wire.BadRequest("body is not a valid JSON object for this subject: %v", err)
	}
	if dec.More() {
		return wire.BadRequest("body holds more than one JSON value")
	}
	return nil
}

func (s *Service) addTag(ctx context.Context, body []byte) (any, error) {
	var r wire.AddTagRequest
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if r.Step == nil {
		return nil, wire.BadRequest("step is required (1 to %d)", segment.MaxStoredStep)
	}
	t := segment.Tag{Name: r.Tag, Step: *r.Step, MaxID: 1}
	if r.MaxID != nil {
		t.MaxID = *r.MaxID
	}
	if r.Description != nil {
		t.Description = *r.Description
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if r.Monotonic != nil && *r.Monotonic && s.cfg.Monotonic == nil {
		return nil, errMonotonicOff
	}
	added, err := s.cfg.Tags.AddTag(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("add tag %q: %w", r.Tag, err)
	}
	s.logger.Info("tag added", "tag", added.Name, "step", added.Step, "max_id", added.MaxID)
	info := tagInfo(added)
	if err := s.markAdded(ctx, &info, r.Monotonic); err != nil {
		return nil, err
	}
	return info, nil
}

func (s *Service) listTags(ctx context.Context, _ []byte) (any, error) {
	tags, err := s.cfg.Tags.Tags(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	marks, err := s.monotonicMarks(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]wire.TagInfo, 0, len(tags))
	for _, t := range tags {
		info := tagInfo(t)
		info.Monotonic = marks[t.Name]
		out = append(out, info)
	}
	return out, nil
}

func (s *Service) updateTag(ctx context.Context, body []byte) (any, error) {
	var r wire.UpdateTagRequest
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	if err := segment.CheckTagName(r.Tag); err != nil {
		return nil, err
	}
	if r.Step == nil && r.Description == nil && r.MaxID == nil && r.Monotonic == nil {
		return nil, wire.BadRequest("nothing to update for tag %q: give step, description, max_id and/or monotonic", r.Tag)
	}
	if r.Monotonic != nil && s.cfg.Monotonic == nil {
		return nil, errMonotonicOff
	}
	if r.Step == nil && r.Description == nil && r.MaxID == nil {
		return s.updateMark(ctx, r.Tag, r.Monotonic)
	}
	u := segment.TagUpdate{Name: r.Tag, Step: r.Step, Description: r.Description, MaxID: r.MaxID}
	if err := u.Validate(); err != nil {
		return nil, err
	}
	updated, err := s.cfg.Tags.UpdateTag(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("update tag %q: %w", r.Tag, err)
	}
	if r.MaxID != nil {
		s.logger.Warn("tag max_id raised by an operator", "tag", updated.Name, "max_id", updated.MaxID)
	}
	s.logger.Info("tag updated", "tag", updated.Name, "step", updated.Step)
	info := tagInfo(updated)
	if err := s.markUpdated(ctx, &info, r.Monotonic); err != nil {
		return nil, err
	}
	return info, nil
}
