package wire

import (
	"strings"
	"time"
)

// DefaultPrefix is the subject prefix when none is configured.
const DefaultPrefix = "leaf"

// Header names of the protocol. The service error headers are the NATS services
// convention's (the same values as nats.go/micro's constants, repeated here so that
// this package needs nothing but the standard library).
const (
	EncodingHeader         = "Leaf-Encoding"
	NodeIDHeader           = "Leaf-Node-Id" // names the answering node on leaf.time
	TagHeader              = "Leaf-Tag"     // names the tag of a request a follower forwards to a monotonic tag's leader
	ServiceErrorCodeHeader = "Nats-Service-Error-Code"
	ServiceErrorHeader     = "Nats-Service-Error"
)

// Subjects names everything a deployment with one prefix uses on NATS. The zero value
// is not useful; build it with NewSubjects after CheckPrefix.
type Subjects struct {
	Prefix string
}

// NewSubjects returns the names for prefix p (checked with CheckPrefix).
func NewSubjects(p string) (Subjects, error) {
	if err := CheckPrefix(p); err != nil {
		return Subjects{}, err
	}
	return Subjects{Prefix: p}, nil
}

// Service is the micro service's name; QueueGroup is the group every dispenser's ID
// subjects share. Both are the prefix.
func (s Subjects) Service() string    { return s.Prefix }
func (s Subjects) QueueGroup() string { return s.Prefix }

// IDs is the subject that asks for IDs of kind and tag: "leaf.segment.orders", the tag
// as its subject token (TagToken: "leaf.segment.com%2Eacme%2Eorder").
func (s Subjects) IDs(kind Kind, tag string) string {
	return s.Prefix + "." + kind.String() + "." + TagToken(tag)
}

// IDsWildcard is the subject a dispenser subscribes to for kind: "leaf.segment.*".
func (s Subjects) IDsWildcard(kind Kind) string { return s.Prefix + "." + kind.String() + ".*" }

// IDsPrefix is IDs without the tag: "leaf.segment.". The tag's token (ParseTagToken)
// is what follows it.
func (s Subjects) IDsPrefix(kind Kind) string { return s.Prefix + "." + kind.String() + "." }

// Decode is the subject that takes a snowflake ID apart.
func (s Subjects) Decode() string { return s.Prefix + ".decode.snowflake" }

// AdminTags is the subject of a tag admin operation: add, list or update.
func (s Subjects) AdminTags(op string) string { return s.Prefix + ".admin.tags." + op }

// MonotonicPings is where a dispenser's $SRV pings of a monotonic tag's leader are
// answered, "_INBOX_leaf_mono." plus a unique token: not an inbox of its connection,
// so that the roles can let the service user answer there and nowhere else
// (PROTOCOL.md "Monotonic tags", deploy/nats-roles.conf).
func (s Subjects) MonotonicPings() string { return "_INBOX_" + s.Prefix + "_mono." }

// Time is the subject every live dispenser answers with its clock.
func (s Subjects) Time() string { return s.Prefix + ".time" }

// Pool is the subject of a bulk pool's batches: "leaf.pool.segment.orders", the tag as
// its subject token (TagToken).
func (s Subjects) Pool(kind Kind, tag string) string {
	return s.Prefix + ".pool." + kind.String() + "." + TagToken(tag)
}

// PoolStream is the JetStream stream that holds the bulk pools: "LEAF_POOL".
func (s Subjects) PoolStream() string { return strings.ToUpper(s.Prefix) + "_POOL" }

// PoolConsumer is the durable consumer of one pool: "segment_orders", the tag as its
// subject token (TagToken), which a consumer name may hold too.
func PoolConsumer(kind Kind, tag string) string { return kind.String() + "_" + TagToken(tag) }

// Bucket is the name of one of the deployment's KV buckets: Bucket("forever") is
// "leaf_forever".
func (s Subjects) Bucket(name string) string { return s.Prefix + "_" + name }

// ReplyAllowed reports whether a dispenser may publish its answer to reply. A reply
// is a publish with the dispenser's own rights, so a caller must not be able to aim it
// at anything but an inbox: never at a system subject (anything starting with "$":
// $JS, $KV, $SYS, $SRV, $O and the server's other reserved spaces), nor at the
// deployment's own subjects (which include the pool stream's). PROTOCOL.md "Reply
// subjects".
func (s Subjects) ReplyAllowed(reply string) bool {
	if reply == "" || reply[0] == '$' {
		return false
	}
	p := s.Prefix
	if reply == p {
		return false
	}
	return !(len(reply) > len(p) && reply[len(p)] == '.' && reply[:len(p)] == p)
}

// PoolMinAckWait is the shortest ack wait of a pool's consumer: a job uses a batch only
// when its confirmed ack came within half the ack wait (PROTOCOL.md "Bulk batches").
const PoolMinAckWait = 30 * time.Second

// HeartbeatInterval is the heartbeat of a node's worker ID, Leaf's 3 s (PROTOCOL.md
// "Clock records"): a clock record may lag what the node issued by at most this (plus
// --borrow-max), so a restarted node waits past record + HeartbeatInterval + borrow-max;
// a KV lease is renewed this often. Not configurable: the records' meaning depends on it.
const HeartbeatInterval = 3 * time.Second
