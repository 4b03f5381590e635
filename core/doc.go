// Package core decides what a request for IDs means, once, for every face: which source
// serves it (a monotonic tag's leader, a pool's ready-made reply, a tag's segment
// buffers, the snowflake generator), how long it may wait and for what (a segment being
// loaded, the monotonic marks loading, a leader's answer, a suspended snowflake
// generator), and which wire error each failure becomes (CodeOf).
//
// The faces only parse and encode: the NATS face (package bus) turns a message into a
// Request and its Answer into a reply; the HTTP face (package httpapi) does the same
// with Leaf's paths. A request goes
//
//	face (parse) -> Take (never waits) -> [Wait (bounded, off the caller's goroutine)] -> face (encode)
//
// Take answers from memory and does no I/O, so the NATS face can call it on its
// delivery goroutine, allocating nothing. When the answer needs a wait, Take says so and
// the face calls Wait, which answers later through a callback; Get is Take and Wait for
// a face that serves each request on a goroutine of its own. Either way the same
// routing, the same bound on waiting, and the same error table apply.
//
// A segment reply gets its tag's range once, here, for every face and for the pools'
// pre-filled replies (Shaper): a tag narrower than 63 bits is refused once its numbers
// leave the range, and an opaque tag's numbers become their images under the tag's
// keyed permutation (package opaque), sorted.
//
// The core also carries out the admin calls on tags (add, list, update, with their
// monotonic marks and ranges) and decodes snowflake IDs, so that what they mean is
// written once.
package core
