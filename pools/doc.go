// Package pools keeps ready-made batches of IDs: replies prepared ahead of time per
// (kind, tag) so that a batch request is answered by handing one over, and the
// JetStream stream <PREFIX>_POOL that feeds bulk (ETL) consumers.
package pools
