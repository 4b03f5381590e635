package wire

// The records the dispensers keep in the deployment's JetStream KV buckets and in
// ZooKeeper, as JSON: the protocol's shapes, which every dispenser of a deployment, of
// any version, must read alike (PROTOCOL.md says what each field means). The packages
// that read and write them use these types. (The monotonic tags' records and the
// deployment record have their own files.)

// ClockRecord is a dispenser's clock record in the forever bucket (key: its node ID),
// and a worker ID's record there (key WorkerKey(id)), which is also the fence that keeps
// one live holder per worker ID: the highest timestamp (Unix ms) issued or borrowed, and
// the ceiling the generator was allowed on its strength. The optional fields are left
// out when empty, so that a node's own record keeps the v1 bytes
// {"worker_id":3,"timestamp":1763790000123}.
type ClockRecord struct {
	WorkerID  int64  `json:"worker_id"`
	Timestamp int64  `json:"timestamp"`
	Ceiling   int64  `json:"ceiling,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
	Instance  string `json:"instance,omitempty"` // the writer's run
	Released  bool   `json:"released,omitempty"` // its holder let the worker ID go
}

// KVLease is the value of a key of the leases bucket (key: the worker ID): who holds the
// lease, and its holder's token, by which the holder knows its own writes.
type KVLease struct {
	NodeID string `json:"node_id"`
	Token  string `json:"token"`
}

// KVWorker is the value of a key of the workers bucket (key: the worker ID): the
// highest timestamp any holder of the worker ID recorded, and the last holder.
type KVWorker struct {
	WorkerID  int64  `json:"worker_id"`
	Timestamp int64  `json:"timestamp"`
	NodeID    string `json:"node_id"`
	Token     string `json:"token"`
}

// SegmentRow is the value of a key of the KV segment store (key: TagKey of the tag):
// Leaf's leaf_alloc row.
type SegmentRow struct {
	MaxID       int64  `json:"max_id"`
	Step        int64  `json:"step"`
	Description string `json:"description"`
	UpdateTime  string `json:"update_time"` // RFC 3339, UTC
}

// ZKLeafNode is the content of a node of Leaf's ZooKeeper layout,
// /snowflake/<name>/forever/<ip>:<port>-<sequence>, as Leaf writes it: Port is a string
// there.
type ZKLeafNode struct {
	IP        string `json:"ip"`
	Port      string `json:"port"`
	Timestamp int64  `json:"timestamp"`
}

// ZKAlive is the content of /snowflake/<name>/leafbus/alive/<ip>:<port>, the ephemeral
// node of the process running as that ip:port; Owner is the token of its data dir's
// cache file.
type ZKAlive struct {
	Advertise string `json:"advertise"`
	PID       int    `json:"pid"`
	Started   int64  `json:"started"`
	Owner     string `json:"owner,omitempty"`
}

// ZKLease is the content of a recycled worker ID's lease node (--zk-recycle): who holds it.
type ZKLease struct {
	Advertise string `json:"advertise"`
	Token     string `json:"token"`
}

// ZKWorker is the content of /snowflake/<name>/leafbus/workers/<id> (--zk-recycle): the
// highest timestamp any holder of the worker ID recorded, and the last holder.
type ZKWorker struct {
	WorkerID  int64  `json:"worker_id"`
	Timestamp int64  `json:"timestamp"`
	Advertise string `json:"advertise"`
	Token     string `json:"token"`
}

// LeaderLease is the value of a key of the leaders bucket (key: TagKey of a monotonic
// tag): who leads the tag and where followers forward its requests. Instance tells a
// restarted dispenser's leases apart (and names its $SRV instance, which followers check
// before they forward); TTLMs is the writer's lease time, which no follower trusts over
// its own. Released is written by a leader that stopped serving the tag on purpose, so
// the next one need not wait out the lease.
type LeaderLease struct {
	Node     string `json:"node"`
	Instance string `json:"instance"`
	Subject  string `json:"subject"` // the leader's inbox for forwarded requests
	TTLMs    int64  `json:"ttl_ms"`
	Released bool   `json:"released,omitempty"`
}

// TagOptions is the value of a key of the tag options bucket (key: TagKey of the tag):
// what Leaf's leaf_alloc has no column for. A value {"monotonic":false} is an operator's
// word that the tag is ordinary; the range is left out when it is the default.
type TagOptions struct {
	Monotonic bool `json:"monotonic"`
	TagRange
}

// PresencePrefix begins the keys of the leaders bucket that are dispensers' presence
// records, "dispensers.<instance>": no tag's KV key holds a '.', so none is a tag's.
const PresencePrefix = "dispensers."

// Presence is a dispenser's presence record in the leaders bucket: up to which
// revision of the tag options bucket its view is complete, what its version knows that
// earlier ones did not (Features: "tag-ranges"), and the tags marked monotonic within
// the last lease TTL that it had served as ordinary tags when it took the mark in, and
// the fingerprint of the ID key of opaque tags it holds (IDKey, "" without one).
type Presence struct {
	Node     string   `json:"node"`
	Marks    uint64   `json:"marks"`
	Features []string `json:"features,omitempty"`
	Busy     []string `json:"busy,omitempty"`
	IDKey    string   `json:"id_key,omitempty"`
}
