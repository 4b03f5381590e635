package service

import (
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

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
// it answers through the reply subject.
func (s *Service) waitForSnowflake(req micro.Request, p *[]int64, enc wire.Encoding, start time.Duration, refusal error) {
	kind, ids := wire.Snowflake.String(), *p
	if err := s.startWaiter(); err != nil {
		s.putIDs(p)
		if errors.Is(err, errOverloaded) {
			s.sfStats.overloaded.Add(1)
			if s.rejecter != nil {
				s.rejecter.Rejected(TransportNATS)
			}
		}
		s.observe(kind, s.fail(req, &s.sfStats, refusal), start, 0)
		return
	}
	s.sfStats.waited.Add(1)
	reply, subject := req.Reply(), req.Subject()
	go func() {
		defer s.endWaiter()
		err := refusal
		deadline := time.Now().Add(s.cfg.WaitMax)
		for mayResume(err) && time.Now().Before(deadline) && !s.isStopping() {
			time.Sleep(snowflakeRetry)
			err = s.cfg.Snowflakes.Fill(ids)
		}
		if err != nil {
			s.putIDs(p)
			s.sfStats.waitErrors.Add(1)
			code, desc := s.describe(subject, &s.sfStats, err)
			s.publish(subject, &nats.Msg{Subject: reply, Header: nats.Header{
				wire.ServiceErrorCodeHeader: []string{strconv.Itoa(code)},
				wire.ServiceErrorHeader:     []string{desc},
			}})
			s.observe(kind, code, start, 0)
			return
		}
		n := len(ids)
		s.sfStats.idsIssued.Add(uint64(n))
		bp := s.getBuf(n * wire.MaxTextID)
		b := wire.AppendIDs((*bp)[:0], ids, enc)
		s.putIDs(p)
		s.publish(subject, &nats.Msg{Subject: reply, Data: b})
		*bp = b
		s.bufs.Put(bp)
		s.observe(kind, codeOK, start, n)
	}()
}

// isStopping reports whether Stop has begun: a held request then gets its answer at
// once rather than holding the stop up.
func (s *Service) isStopping() bool {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	return s.stopping
}
