package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// admin wraps an admin call: the core runs it on a goroutine of its own, bounded by its
// admin timeout, and it answers JSON or an error through the reply subject.
func (s *Service) admin(call func(ctx context.Context, body []byte) (any, error)) handler {
	return func(e *endpoint, m *nats.Msg, _ time.Duration) outcome {
		// nats.go gives every delivered message its own copy of the payload, so the body
		// may be read after the handler returns.
		body, reply, subject := m.Data, m.Reply, m.Subject
		s.pending.Add(1)
		err := s.core.Admin(func(ctx context.Context) {
			defer s.pending.Done()
			v, err := call(ctx, body)
			var b []byte
			if err == nil {
				b, err = json.Marshal(v)
			}
			if err != nil {
				code, desc := s.describe(subject, err)
				s.replyError(e, subject, reply, code, desc)
				return
			}
			s.reply(e, subject, reply, b)
		})
		if err != nil {
			s.pending.Done()
			s.fail(e, m, err)
		}
		return outcome{} // admin calls are not observed
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
	return s.core.AddTag(ctx, r)
}

func (s *Service) listTags(ctx context.Context, _ []byte) (any, error) {
	return s.core.ListTags(ctx)
}

func (s *Service) updateTag(ctx context.Context, body []byte) (any, error) {
	var r wire.UpdateTagRequest
	if err := decodeStrict(body, &r); err != nil {
		return nil, err
	}
	return s.core.UpdateTag(ctx, r)
}
