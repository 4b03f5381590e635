package wire

import "strconv"

// The deployment's JetStream KV buckets, by their name after the prefix: the bucket is
// Subjects.Bucket(name), "leaf_segments" and so on. PROTOCOL.md "KV buckets and streams
// at a glance" says what each holds.
const (
	BucketSegments = "segments" // the KV segment store: one key per tag
	BucketLeases   = "leases"   // the KV registry's worker-ID leases
	BucketWorkers  = "workers"  // the KV registry's highest timestamp per worker ID
	BucketForever  = "forever"  // clock records: per node ID, and the worker records
	BucketTagOpts  = "tagopts"  // per-tag options Leaf's leaf_alloc has no column for (monotonic)
	BucketLeaders  = "leaders"  // monotonic tags' leader leases and the dispensers' presence
	// DeploymentBucket, "deployment", is the deployment record's (deployment.go).
)

// KVSubjects is the start of the subjects a KV bucket's keys are stored under, as
// JetStream spells them: "$KV.leaf_segments."; a key's subject is it plus the key.
func KVSubjects(bucket string) string { return "$KV." + bucket + "." }

// KVStream is the JetStream stream behind a KV bucket: "KV_leaf_segments".
func KVStream(bucket string) string { return "KV_" + bucket }

// WorkerKey is the forever bucket's key of worker ID id's record, "worker-3": what must
// never repeat is a (worker ID, timestamp) pair, whichever node holds the ID, and the
// record is the fence that keeps one live holder per worker ID.
func WorkerKey(id int64) string { return "worker-" + strconv.FormatInt(id, 10) }

// Headers of the NATS server's own "no responders" answer: when nothing subscribes to a
// request's subject, the server answers at once with an empty body and this status.
// nats.go keeps both names unexported.
const (
	statusHeader       = "Status"
	noRespondersStatus = "503"
)

// NoResponders reports whether a reply (its header and body) is the server's "no
// responders" status rather than an answer: for code that reads replies from its own
// subscription, which nats.go's Request does not turn into nats.ErrNoResponders.
func NoResponders(header map[string][]string, body []byte) bool {
	if len(body) != 0 {
		return false
	}
	v := header[statusHeader]
	return len(v) > 0 && v[0] == noRespondersStatus
}
