package wire

// DevelVersion is the $SRV version of a dispenser built without a semantic module version
// (a checkout, `go run`, a test binary): semver's lowest pre-release, so that it sorts
// before every release. A released build answers its own (internal/buildinfo).
const DevelVersion = "0.0.0-devel"

// Keys of a dispenser's $SRV.INFO metadata (PROTOCOL.md): what clients read the batch
// bound from, and what discovery and the peers' worker-ID range check read.
const (
	MetaMaxBatch    = "max_batch"     // the largest count one request may ask for
	MetaNodeID      = "node_id"       // --node-id
	MetaWorkerID    = "worker_id"     // the snowflake worker ID in use now
	MetaWorkerIDMin = "worker_id_min" // --worker-id-min
	MetaWorkerIDMax = "worker_id_max" // --worker-id-max
	MetaBuild       = "build"         // the binary's version and VCS revision, as `dispenser version` prints them

	// The snowflake layout (--snowflake-layout) and what it holds: its name ("leaf",
	// "js53"), how many worker IDs it has and how many IDs one worker issues in one
	// millisecond. Every dispenser of a deployment must run one layout.
	MetaSnowflakeLayout  = "snowflake_layout"
	MetaSnowflakeWorkers = "snowflake_workers"
	MetaSnowflakePerMs   = "snowflake_ids_per_ms"

	// MetaDeploymentRecord is the version of the deployment record (DeploymentVersion)
	// the dispenser checks itself against at start and watches while it runs. A peer
	// without it is from before the record: it neither checks nor keeps it.
	MetaDeploymentRecord = "deployment_record"
)

// MetaDeployment is this dispenser's own part of the deployment record, as JSON: its
// segment store, its worker registry with its worker IDs, its snowflake layout and epoch
// ({"segment_store":{...},"worker_registry":{...},"snowflake":{...}}, the fields of
// Deployment). A dispenser that starts where the record is gone, and `dispenser
// deployment set`, read it to see what the live fleet is.
const MetaDeployment = "deployment"
