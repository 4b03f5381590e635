// Package service is the dispenser's NATS face: one nats.go/micro service, named after the
// prefix and in the queue group of the same name, whose endpoints hand out segment and
// snowflake IDs, decode snowflake IDs and administer tags (PROTOCOL.md). Like micro's own
// examples it describes the service as data, a list of endpoints whose handlers parse
// with wire, call a generator and encode with wire.
//
// Every endpoint drops, unanswered, a request whose reply subject is not an inbox, since
// a reply is a publish with the dispenser's own rights. CodeOf's table is the one place
// that turns the packages' errors into wire codes; an error it does not know is a 500,
// logged in full and generic on the wire.
package service
