package metrics

import "time"

// Sources are the snapshots a scrape (and the HTTP status page) reads: funcs the
// dispenser fills from the segment and snowflake generators, the heartbeat, the pools
// and the embedded NATS server. Each is called once per scrape, from the scraping
// goroutine, so it must be safe to call concurrently with serving; a nil func means the
// dispenser has no such part, and its metrics are left out.
type Sources struct {
	// SegmentTags returns every segment tag's double buffer.
	SegmentTags func() []SegmentTag
	// Snowflake returns the snowflake worker's state; ok is false while it has none.
	Snowflake func() (s Snowflake, ok bool)
	// Pools returns every pre-filled pool: reply batches and the JetStream pool stream.
	Pools func() []Pool
	// NATS returns the embedded NATS server's figures; nil when NATS is not embedded.
	NATS func() NATSServer
	// Recovery returns how the dispenser came back from faults.
	Recovery func() Recovery
	// Monotonic returns every monotonic tag as this dispenser sees it.
	Monotonic func() Monotonic
	// Deployment returns how the deployment record stands with this dispenser.
	Deployment func() Deployment
}

// Deployment is how the deployment record stands with a running dispenser
// (deployment.Watch): Problem is set while the record contradicts it, is gone or
// unreadable, or names a tag range it refused; Refusals counts the records it refused
// or wrote back since start.
type Deployment struct {
	Problem  bool
	Refusals uint64
}

// Monotonic is the dispenser's view of its monotonic tags (monotonic.Stats).
type Monotonic struct {
	Tags []MonotonicTag
	// RefusedReplies counts forwarded requests refused because their reply subject was
	// not an inbox.
	RefusedReplies uint64
}

// Monotonic tag roles, as MonotonicTag.Role.
const (
	RoleLeader   = "leader"   // this dispenser holds the tag's lease and serves it
	RoleStarting = "starting" // took the lease, waiting out the previous leader's
	RoleFollower = "follower" // another dispenser leads; requests are forwarded to it
	RoleNone     = "none"     // no leader known: requests for the tag get 503
)

// MonotonicRoles lists every role, in the order the metrics show them.
var MonotonicRoles = []string{RoleLeader, RoleStarting, RoleFollower, RoleNone}

// MonotonicTag is one monotonic tag as this dispenser sees it.
type MonotonicTag struct {
	Tag  string
	Role string // one of MonotonicRoles
	// Terms counts the leases this dispenser took for the tag.
	Terms uint64
	// Forwarded counts requests forwarded to the leader and answered, ForwardErrors
	// those refused or unanswered, ForwardMessages the messages that carried them.
	Forwarded, ForwardErrors, ForwardMessages uint64
}

// Recovery is how a dispenser recovers from faults (a dependency down, its worker ID
// lost): the time from the fault's end (the dependency back) to full service.
type Recovery struct {
	// Faults counts the faults seen since start; InFault is true while one lasts.
	Faults  uint64
	InFault bool
	// Last is the last fault's time from its end to full service, Max the longest.
	Last, Max time.Duration
}

// SegmentTag is one tag's double buffer (Leaf's SegmentBuffer) at one moment.
type SegmentTag struct {
	Tag     string
	Current Segment // the segment IDs are handed out from
	Next    Segment // the segment loaded ahead; zero while none is
	// NextReady is Leaf's nextReady: the next segment is loaded and waiting.
	NextReady bool
	// Step is the step of the last load (Leaf's dynamic step), in IDs.
	Step int64
	// Issued counts the IDs handed out for this tag since start; it ranks tags for
	// Config.MaxTags, so it only needs to grow with the tag's traffic.
	Issued uint64
	// Loads counts segments taken from the store, LoadErrors the store calls of loads
	// that failed (each is retried). LoadSeconds is the time spent in all of those calls.
	Loads       uint64
	LoadErrors  uint64
	LoadSeconds float64
	// LastLoad is when the last segment arrived; zero before the first.
	LastLoad  time.Time
	LastError string
}

// Segment is the range of one load, in Leaf's terms: Value is the next ID to hand out,
// Max one past the last, Step the length asked for.
type Segment struct {
	Value, Max, Step int64
}

// Remaining is how many IDs the segment still holds.
func (s Segment) Remaining() int64 { return max(s.Max-s.Value, 0) }

// Lease states of Snowflake.Lease.
const (
	LeaseHeld      = "held"      // worker ID held, records current: snowflake IDs are served
	LeaseSuspended = "suspended" // held, but serving is paused (not recorded yet, renewal late)
	LeaseLost      = "lost"      // the worker ID is no longer this node's
)

// LeaseStates lists every state, in the order the metrics show them.
var LeaseStates = []string{LeaseHeld, LeaseSuspended, LeaseLost}

// Snowflake is the snowflake worker's state: snowflake.Generator.Stats and the
// heartbeat's (workerid.HeartbeatStats), and what registry the worker ID came from.
type Snowflake struct {
	WorkerID int64
	Registry string // kv | zk | mysql | static
	// Lease is LeaseHeld, LeaseSuspended or LeaseLost; LeaseTTL is 0 for a worker ID held
	// for good (ZooKeeper in Leaf's layout, MySQL, static).
	Lease         string
	LeaseTTL      time.Duration
	SuspendReason string
	// Record is the last clock record written (Unix ms); LastRecord when it was written.
	Record     int64
	LastRecord time.Time
	// Offset is how far the clock reads behind the highest reading seen (a step back).
	Offset time.Duration
	// Borrowed is how far the highest timestamp issued is ahead of the clock.
	Borrowed time.Duration
	// Issued is the highest timestamp issued (Unix ms).
	Issued int64
	// Refused counts requests the generator refused since start (any error).
	Refused uint64
}

// Pool is one pre-filled pool of batches (pools.PoolStats or pools.StreamStats).
type Pool struct {
	Kind  string // segment | snowflake
	Tag   string
	Where string // "replies" (ready replies in memory) or "stream" (the JetStream pool stream)
	Size  int    // IDs per batch
	Depth int    // the most batches kept ready
	Ready int    // batches ready now
}

// NATSServer is the embedded NATS server's figures (server.Varz).
type NATSServer struct {
	Connections int
	// JetStream storage in use and the limits reserved, in bytes.
	JetStreamMemory, JetStreamStore       uint64
	JetStreamMaxMemory, JetStreamMaxStore int64
}
