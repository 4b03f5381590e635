// Package client is what a Go application imports to get IDs from leafbus dispensers:
// Client asks for segment and snowflake IDs over NATS request/reply (and decodes IDs and
// manages tags), Buffer keeps IDs fetched ahead so that Next is served from memory, the
// client-side counterpart of Leaf's double buffer, and Consumer takes ready batches from
// a bulk pool of the JetStream pool stream for ETL jobs, by the rule PROTOCOL.md sets
// for every job. ConnConfig holds the connection flags the dispenser and bench share.
// AskAll asks every dispenser at once ($SRV.INFO.<prefix>, <prefix>.time) and collects
// their answers within bounds (answers kept, bytes per answer, a window, a quiet time),
// by the protocol's rules from wire: what any client that wants to hear from every
// dispenser uses, the dispensers themselves included (their peer checks and status
// page).
//
// It depends on wire and nats.go only: an application that asks for IDs links none of
// the server side (nats-server, ZooKeeper, MySQL).
package client
