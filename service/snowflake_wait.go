package service

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// A snowflake generator that refuses for a while (suspended while its lease is
// renewed or its worker ID replaced, at its ceiling until the next heartbeat record)
// usually issues again within a second. A
// request it refuses is therefore held, off the delivery goroutine, like a segment
// request waiting for a load: answered with IDs as soon as the generator issues again,
// or with the refusal (503) after WaitMax. A client that hedges (client.WithHedge) has
// meanwhile sent its copy to another dispenser of the queue group and taken that answer,
// so one dispenser's pause costs it milliseconds, not an error. A clock stepped back is
// answered at once: it lasts as long as the step.

// snowflakeRetry is how often a held snowflake request asks the generator again.
const snowflakeRetry = 5 * time.Millisecond

// mayResume reports whether the generator's refusal lifts by itself soon.
func mayResume(err error) bool {
	return errors.Is(err, snowflake.ErrSuspended) || errors.Is(err, snowflake.ErrCeiling)
}

// waitForSnowflake answers a snowflake request the generator refused with refusal
// (mayResume) once it issues again, or with refusal after WaitMax. Like waitForSegment
// it takes its IDs from the pool, the endpoint's scratch space being the delivery
// goroutine's.
func (s *Service) waitForSnowflake(e *endpoint, m *nats.Msg, n int, enc wire.Encoding, start time.Duration, refusal error) error {
	if err := s.startWaiter(); err != nil {
		return s.refuseWaiter(&s.sfStats, err, refusal)
	}
	s.sfStats.waited.Add(1)
	reply, subject := m.Reply, m.Subject
	go func() {
		defer s.endWaiter()
		p := s.getIDs(n)
		err := refusal
		deadline := time.Now().Add(s.cfg.WaitMax)
		for mayResume(err) && time.Now().Before(deadline) && !s.isStopping() {
			time.Sleep(snowflakeRetry)
			err = s.cfg.Snowflakes.Fill(*p)
		}
		s.answerWaited(e, subject, reply, wire.Snowflake, &s.sfStats, p, enc, start, err)
	}()
	return nil
}

// isStopping reports whether Stop has begun: a held request then gets its answer at
// once rather than holding the stop up.
func (s *Service) isStopping() bool {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	return s.stopping
}
