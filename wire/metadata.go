package wire

// Keys of a dispenser's $SRV.INFO metadata (PROTOCOL.md): what clients read the batch
// bound from, and what discovery and the peers' worker-ID range check read.
const (
	MetaMaxBatch    = "max_batch"     // the largest count one request may ask for
	MetaNodeID      = "node_id"       // --node-id
	MetaWorkerID    = "worker_id"     // the snowflake worker ID in use now
	MetaWorkerIDMin = "worker_id_min" // --worker-id-min
	MetaWorkerIDMax = "worker_id_max" // --worker-id-max

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
