package bus

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// The NATS service API, served for the dispenser's own endpoints: PING, INFO and STATS
// on $SRV.<VERB>, $SRV.<VERB>.<name> and $SRV.<VERB>.<name>.<id>, answered with micro's
// own types, so that `nats micro ls|info|stats`, micro clients, the dispenser's peer
// range check and bench's responder count see the dispenser as they would a micro
// service.

// subscribeVerbs subscribes the control subjects (every instance answers: no queue group).
func (s *Service) subscribeVerbs() error {
	for _, v := range []struct {
		verb   micro.Verb
		answer func() any
	}{
		{micro.PingVerb, func() any { return micro.Ping{ServiceIdentity: s.identity(), Type: micro.PingResponseType} }},
		{micro.InfoVerb, func() any { return s.Info() }},
		{micro.StatsVerb, func() any { return s.stats() }},
	} {
		for _, scope := range [][2]string{{"", ""}, {s.subjects.Service(), ""}, {s.subjects.Service(), s.id}} {
			subject, err := micro.ControlSubject(v.verb, scope[0], scope[1])
			if err != nil {
				return fmt.Errorf("service API subject of %s: %w", v.verb, err)
			}
			sub, err := s.nc.Subscribe(subject, func(m *nats.Msg) { s.answerVerb(m, v.answer) })
			if err != nil {
				return fmt.Errorf("subscribe %s: %w", subject, err)
			}
			s.verbSubs = append(s.verbSubs, sub)
		}
	}
	return nil
}

// answerVerb answers a control request, unless its reply subject is one no answer may
// go to: the reply guard drops it, counts it and logs it, as for the endpoints.
func (s *Service) answerVerb(m *nats.Msg, answer func() any) {
	if !s.guard.allow("$SRV", &s.verbsRefused, m.Subject, m.Reply) {
		return
	}
	b, err := json.Marshal(answer())
	if err != nil {
		s.logger.Error("service API answer not encoded", "subject", m.Subject, "err", err)
		return
	}
	if err := s.nc.Publish(m.Reply, b); err != nil {
		s.logger.Warn("service API answer not sent", "subject", m.Subject, "err", err)
	}
}

func (s *Service) identity() micro.ServiceIdentity {
	return micro.ServiceIdentity{
		Name:     s.subjects.Service(),
		ID:       s.id,
		Version:  s.cfg.Version,
		Metadata: s.currentMetadata(),
	}
}

// currentMetadata is the $SRV metadata now: a copy (the caller's to keep, as micro's)
// of the fixed entries with LiveMetadata's over them.
func (s *Service) currentMetadata() map[string]string {
	m := maps.Clone(s.metadata)
	if s.cfg.LiveMetadata != nil {
		maps.Copy(m, s.cfg.LiveMetadata())
	}
	return m
}

// Info is the service's $SRV.INFO answer.
func (s *Service) Info() micro.Info {
	info := micro.Info{
		ServiceIdentity: s.identity(),
		Type:            micro.InfoResponseType,
		Description:     description,
		Endpoints:       make([]micro.EndpointInfo, 0, len(s.endpoints)),
	}
	for _, e := range s.endpoints {
		info.Endpoints = append(info.Endpoints, micro.EndpointInfo{Name: e.name, Subject: e.subject, QueueGroup: s.subjects.QueueGroup()})
	}
	return info
}

// stats is the service's $SRV.STATS answer: micro's counts per endpoint, with the
// service's own figures (and Config.Stats's) as each endpoint's data.
func (s *Service) stats() micro.Stats {
	st := micro.Stats{
		ServiceIdentity: s.identity(),
		Type:            micro.StatsResponseType,
		Started:         s.started,
		Endpoints:       make([]*micro.EndpointStats, 0, len(s.endpoints)),
	}
	for _, e := range s.endpoints {
		es := &micro.EndpointStats{
			Name:           e.name,
			Subject:        e.subject,
			QueueGroup:     s.subjects.QueueGroup(),
			NumRequests:    int(e.requests.Load()),
			NumErrors:      int(e.errors.Load()),
			ProcessingTime: time.Duration(e.busy.Load()),
		}
		if es.NumRequests > 0 {
			es.AverageProcessingTime = es.ProcessingTime / time.Duration(es.NumRequests)
		}
		if last := e.lastErr.Load(); last != nil {
			es.LastError = *last
		}
		es.Data, _ = json.Marshal(s.endpointStats(e)) // as micro: data that does not encode is left out
		st.Endpoints = append(st.Endpoints, es)
	}
	return st
}

// endpointStats is the data of an endpoint's $SRV.STATS entry; nil when it has none.
func (s *Service) endpointStats(e *endpoint) any {
	data := map[string]any{}
	if n := e.refused.Load(); n > 0 {
		data["refused_replies"] = n
	}
	if n := s.verbsRefused.Load(); n > 0 {
		data["refused_control_replies"] = n // $SRV requests: the service's, shown with each endpoint
	}
	if e.isIDs { // the core's figures, over every face
		st := s.core.Stats(e.kind)
		data["ids_issued"] = st.IDsIssued
		data["pooled_replies"] = st.Pooled
		data["waited"] = st.Waited
		data["wait_errors"] = st.WaitErrors
		data["overloaded"] = st.Overloaded
		if st.LastUnavailable != "" {
			data["last_unavailable"] = st.LastUnavailable
		}
	}
	if s.cfg.Stats != nil {
		if extra := s.cfg.Stats(e.name); extra != nil {
			data["source"] = extra
		}
	}
	if len(data) == 0 {
		return nil
	}
	return data
}
