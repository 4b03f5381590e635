package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/wire"
)

// Followers forward a tag's requests only to a leader they verified: the instance its
// lease record names answers $SRV.PING.<prefix>.<instance> as an instance of this
// service (name <prefix>, that ID, and, when its metadata has one, the record's node
// ID). So a record naming any inbox at all (written by hand, by another deployment, or
// left by a dispenser that is gone) gets no request. The check is made once per term
// (the record's instance and subject; its renewals keep both), by the tag's campaign,
// off the request path, and an instance's answer is kept for a lease TTL, so that the
// many tags one leader takes at once cost one ping.
//
// It is no authentication: on a NATS account where anyone may subscribe to anything,
// a party that writes lease records can also answer pings. What stands between such a
// party and the clients is the check of every answer (forward.go): IDs strictly
// increasing, as many as asked, above every ID this dispenser passed on before.

// leaseID is what a verification covers: one term of one leader.
type leaseID struct{ instance, subject string }

// instanceCheck is the last answer about one instance.
type instanceCheck struct {
	ok bool
	at time.Duration
}

// maxInstanceChecks bounds the cache of instance answers (a party writing records with
// ever new instances cannot grow it further); older answers are dropped first.
const maxInstanceChecks = 1024

// verifiedLeader reports whether h names another dispenser to forward to, and that
// leader was verified for its current term. It costs two atomic loads.
func (m *Manager) verifiedLeader(ts *tagState, h *holder) bool {
	if !m.leaderKnown(h) {
		return false
	}
	v := ts.verified.Load()
	return v != nil && v.instance == h.rec.Instance && v.subject == h.rec.Subject
}

// verifyHolder verifies the leader h names unless it is verified already, and reports
// whether it is. Run by the tag's campaign.
func (m *Manager) verifyHolder(ctx context.Context, ts *tagState, h *holder) bool {
	if !m.leaderKnown(h) {
		return false
	}
	if m.verifiedLeader(ts, h) {
		return true
	}
	if ok, err := m.checkInstance(ctx, h.rec.Instance, h.rec.Node); !ok {
		ts.unverified.Add(1)
		if now := m.now(); ts.verifyWarned == 0 || now-ts.verifyWarned >= m.cfg.LeaseTTL {
			ts.verifyWarned = now
			m.log.Warn("monotonic: the lease record names no live dispenser of this deployment (its instance does not answer $SRV.PING."+m.subjects.Service()+".<instance>, which this node's NATS user must be allowed to ask); requests of the tag are not forwarded to it",
				"tag", ts.name, "node", wire.Quote(h.rec.Node), "instance", wire.Quote(h.rec.Instance), "revision", h.rev, "err", err)
		}
		return false
	}
	ts.verified.Store(&leaseID{instance: h.rec.Instance, subject: h.rec.Subject})
	ts.changed.fire()
	return true
}

// checkInstance asks $SRV.PING.<prefix>.<instance> whether instance is a live instance of
// this service, with the node ID node; an answer is kept for a lease TTL (a refusal
// for the retry interval). The error says why a fresh check failed.
func (m *Manager) checkInstance(ctx context.Context, instance, node string) (bool, error) {
	if !validInstance(instance) {
		return false, errors.New("not an instance ID")
	}
	now := m.now()
	m.checkMu.Lock()
	c, ok := m.checks[instance]
	m.checkMu.Unlock()
	switch {
	case ok && c.ok && now-c.at < m.cfg.LeaseTTL:
		return true, nil
	case ok && !c.ok && now-c.at < m.cfg.retryInterval():
		return false, errors.New("refused moments ago")
	}
	subject, err := micro.ControlSubject(micro.PingVerb, m.subjects.Service(), instance)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ForwardTimeout)
	defer cancel()
	answer := false
	msg, err := m.ping(ctx, subject)
	if err == nil {
		var p micro.Ping
		answer = json.Unmarshal(msg.Data, &p) == nil && p.Type == micro.PingResponseType &&
			p.Name == m.subjects.Service() && p.ID == instance &&
			(p.Metadata[wire.MetaNodeID] == "" || p.Metadata[wire.MetaNodeID] == node)
		if !answer {
			err = fmt.Errorf("answered %s", wire.Quote(string(msg.Data)))
		}
	}
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	if len(m.checks) >= maxInstanceChecks {
		for k, old := range m.checks {
			if now-old.at >= m.cfg.LeaseTTL {
				delete(m.checks, k)
			}
		}
		if len(m.checks) >= maxInstanceChecks {
			clear(m.checks)
		}
	}
	m.checks[instance] = instanceCheck{ok: answer, at: m.now()}
	return answer, err
}

// ping sends a $SRV request and returns the first answer. Its reply subject is
// _INBOX_<prefix>_mono.<unique> rather than an inbox of the connection: a dispenser's
// service connection has to be allowed to answer there, and deploy/nats-roles.conf
// lets its user publish to nothing but replies through an import (_R_.>, which no
// client may name as a reply subject) and these subjects.
func (m *Manager) ping(ctx context.Context, subject string) (*nats.Msg, error) {
	reply := wire.Subjects{Prefix: m.cfg.Prefix}.MonotonicPings() + strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix)
	sub, err := m.nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := m.nc.PublishRequest(subject, reply, nil); err != nil {
		return nil, err
	}
	msg, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, err
	}
	if wire.NoResponders(msg.Header, msg.Data) {
		return nil, nats.ErrNoResponders
	}
	return msg, nil
}

// validInstance reports whether s can be an instance ID: one subject token of a NUID's
// characters (a record may hold anything).
func validInstance(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
