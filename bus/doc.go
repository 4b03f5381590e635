// Package bus is the dispenser's NATS face: one service of the NATS service API (the
// protocol of nats.go/micro, which `nats micro` and $SRV discovery read), named after the
// prefix and in the queue group of the same name, whose endpoints hand out segment and
// snowflake IDs, decode snowflake IDs and administer tags (PROTOCOL.md). Like micro's own
// examples it describes the service as data, a list of endpoints whose handlers parse
// with wire, ask package core what the request means, and encode with wire.
//
// The endpoints are plain queue subscriptions answering with plain publishes, and the
// service answers $SRV PING, INFO and STATS itself with micro's types: micro's
// per-request wrapper, reply message, clocks and lock cost as much CPU as the
// dispenser's own work on the ID subjects, and an ID reply here allocates nothing.
//
// Every endpoint, and the $SRV answers, drop unanswered a request whose reply subject is
// not an inbox, since a reply is a publish with the dispenser's own rights. Errors are
// answered through core.CodeOf, the one table of wire codes; an error it does not know
// is a 500, logged in full and generic on the wire.
//
// The embedded NATS server of the one-binary default (StartEmbedded) is part of this
// face too: a server with JetStream in the dispenser's process, which the service and
// the rest of the dispenser reach through in-process connections, and which refuses to
// listen beyond loopback with nobody to authenticate clients.
package bus
