// Package wire is leafbus protocol v1 (docs/PROTOCOL.md in the repository) as Go, on the standard
// library only: kinds and encodings, the subjects and names derived from a prefix, every
// name rule (prefix, tag, node ID), count and ID parsing, the text and binary ID codecs,
// the admin and decode JSON shapes, and the error codes with their Error type.
//
// The dispenser's service, its HTTP face, the Go client, the pools and cmd/bench all
// take the protocol from here, so a rule is written once and cannot drift. Like
// net/textproto, it knows the format and nothing of the transport.
package wire
