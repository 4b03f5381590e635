// Package monotonic serves the segment tags marked monotonic (PROTOCOL.md "Monotonic
// tags") with the stronger promise: across all dispensers and across replies, every ID
// in a reply is greater than every ID of that tag in any reply received before the
// request was sent. It is Leaf's segment mode with one server per tag, the way a
// primary serves a key in a lease-based store (Chubby, etcd's lessor), built on
// JetStream KV and core NATS.
//
// # Which tags are monotonic
//
// The mark is the key of the tag in the KV bucket <prefix>_tagopts, so Leaf's
// leaf_alloc is not changed and the KV and MySQL stores work alike. Every dispenser
// watches it; until it has loaded it, segment requests are answered 503. A tag is
// monotonic on a dispenser when
//
//   - its value in <prefix>_tagopts says so ({"monotonic":true});
//   - it has no value there (a deleted or purged key, a bucket lost and created again)
//     and this dispenser remembers it: every tag it treated as monotonic is written to a
//     file of its data dir (Config.MemoryFile) before it leads the tag or forwards a
//     request of it, and stays there until the value {"monotonic":false} says the
//     operator made it ordinary (`dispenser tag update --monotonic=false`). A dispenser
//     that finds a remembered tag without a value writes the mark back;
//   - or its lease record in <prefix>_leaders is live (held, not seen unchanged for a
//     lease TTL), mark or not: a dispenser that knows nothing else of the tag still never
//     serves it as an ordinary tag while someone leads it.
//
// A tag marked ordinary stays monotonic until its leader gave the lease back; the
// update that marks it answers once that happened on the dispenser that answers it.
// A dispenser whose marks watch lags its leases watch may take that released lease
// before it sees the mark, and see the mark while the write is under way: its campaign
// ends, and the write, stored all the same, leaves a live record of its own that no
// term serves. A dispenser gives back any such record of its own for a tag it may not
// lead, as a leader that stops does, so the tag does not stay monotonic for a lease TTL.
//
// # When the promise starts
//
// Marking a tag (SetMonotonic, behind `tag add|update --monotonic`) returns once every
// dispenser has taken the mark in: each keeps a presence record in <prefix>_leaders
// saying up to which revision of <prefix>_tagopts its view is complete, writes it
// before it first lists the marks and again as soon as its view grows, and the mark's
// writer waits until every record reaches the mark (LeaseTTL/2 at most; one that does
// not is logged). From then on no dispenser serves the tag as an ordinary tag, and the
// promise holds for every request sent after the mark's admin request was answered.
//
// The first leader of a tag marked while the dispensers run takes its first segment
// only once the tag has settled: no ordinary reply of it can come later from above
// that segment. A dispenser that has served the tag as an ordinary tag (it has a
// segment high-water mark of it, Config.SegmentMarks) says so in its presence record,
// since it may still answer an ordinary request it took before the mark, from a
// segment it loads later; then the leader waits half a lease TTL from when it saw the
// mark (those requests wait 2 s at most). A tag no dispenser has served (one just
// added monotonic) has settled as soon as every presence record shows the mark, so its
// leader serves from its first lease on. A request sent before the add was answered
// and still waiting for the tag's first ordinary segment is the one case left out: do
// not ask for a tag before its add answered.
//
// # Leases
//
// One dispenser at a time leads a monotonic tag, under a lease: the key of the tag in
// <prefix>_leaders. The record names the leader's $SRV instance and an inbox subject of
// its own where followers forward requests. Every write of the key but the very first
// is a compare-and-set on the revision the writer saw, so a write succeeds only if
// nobody wrote the key since: the leader renews every RenewInterval over the revision
// it wrote last, and a renewal that finds another revision means the lease is lost. The
// bucket keeps a record for twice the lease TTL after its last write; expiry only
// collects what nobody took, and safety does not depend on it, but for a tag's first
// lease (below). A record's ttl_ms is written for people; every dispenser times leases
// with its own LeaseTTL.
//
// # Fencing, by time
//
// A leader serves only while its clock is within half a TTL of the send of its last
// renewal that succeeded; it checks that for every request, after the request
// arrived. The others take the lease over:
//
//   - from a record they have seen unchanged for a whole TTL on their own clock, by a
//     compare-and-set on its revision: its leader sent its last successful renewal
//     before it could be seen, and stopped serving half a TTL later, so half a TTL
//     before the takeover at least; the compare-and-set proves no renewal came since;
//   - from a record whose leader no longer answers (no subscriber on its inbox, or its
//     instance does not answer $SRV) and that they have seen unchanged for two
//     renewals, by a compare-and-set on its revision, serving from half a TTL after
//     they first saw it: by the same argument its leader stopped serving by then. A
//     killed leader's tag is served again about half a TTL after its last renewal;
//   - from a released record (its leader stopped serving, or never served under the
//     record it releases, then wrote it), at once. The first lease of a tag is such a
//     record too: SetMonotonic writes it, before the mark, when the tag is monotonic
//     neither by its value nor in the writer's view and its lease key holds nothing at
//     all (whoever led it last wrote more than two TTLs ago, by the bucket's record
//     lifetime), so a new tag's first leader serves as soon as its lease is written;
//   - from a record of their own (nobody wrote the key since), at once;
//   - from no record at all (it expired, was deleted, or the bucket was lost), by a
//     create-only write, and then serve no earlier than half a TTL after the write
//     returned: the previous leader's last successful renewal was stored before that
//     write, so it was sent before the write returned.
//
// So two leaders never serve at once, whatever the NATS servers' clocks do, as long as
// the dispensers' clocks measure half a TTL alike (they run on Go's monotonic clock).
//
// A request that passed the check was sent before any later leader served, so the IDs
// it takes may leave after that: the promise only concerns replies received before a
// request was sent.
//
// # One sequence per term
//
// Each lease a leader takes (a term) serves from a sequence of its own, filled with
// fresh segments straight from the store (segment.Generator.TakeSegment, which checks
// the high-water marks): never a buffer held before. The sequence holds the current
// segment and one fetched ahead, always above it, and hands IDs out strictly in order
// under one lock. A term takes its first segment only once it may serve (after the
// previous leader stopped, by the rules above), and a segment joins a term only if the
// store call returned while the lease was valid: so every segment of an earlier term
// was granted before any segment of a later one, and every ID of a later term is above
// every ID of an earlier one.
//
// # Forwarding
//
// A request that reaches a dispenser that does not lead the tag is forwarded to the
// leader's inbox (a core NATS request on the dispenser's JetStream connection: only
// inbox subjects, and $SRV.PING.<prefix>.* answered on _INBOX_<prefix>_mono.>, are
// used) and the answer relayed, within
// ForwardTimeout. Requests that arrive while earlier ones are under way travel together
// in the next forwarded message. A forwarded request was sent after the client's
// request, so the leader's check covers it.
//
// A follower forwards only to a leader it verified: the instance the record names
// answers $SRV.PING.<prefix>.<instance> as a dispenser of this service (checked once
// per term, off the request path). And it checks every answer before passing any of
// it on: as many IDs as asked, strictly increasing, and above every ID of the tag it
// handed out before it asked (its own terms' and its leaders'); an answer that is not
// is refused (503) and counted. A record naming any inbox at all, or an inbox answered
// by anything but a leader, costs a 503, never an ID out of order.
//
// # Waiting instead of refusing
//
// A request that finds no leader to serve it (no verified leader yet, a hand-over
// under way, this dispenser's new term waiting out the previous one, a leader that no
// longer answers) waits for the next one, as a segment request waits for a store that
// loads: until its ctx ends (Fill) or its wait passed (FillAsyncWithin), and only then is
// it answered 503. The waiting requests hold no goroutine of their own: a tag's
// senders (MaxInFlight at most) carry them, and serve them from this dispenser's term
// when it becomes the leader.
//
// # Faults
//
//   - Leader killed: followers find its inbox without subscriber, one takes the lease
//     over after two renewals of silence and serves from half a TTL after the record
//     was first seen; requests wait meanwhile (a TTL of 2 s: about a second).
//   - Leader paused (GC, SIGSTOP, VM pause) past half a TTL: on resume its clock says
//     its term is over; it serves nothing from it, and takes the lease again only by a
//     new write (with a fresh segment), if nobody took it meanwhile.
//   - NATS unreachable from the leader: renewals fail, it stops at half a TTL; the
//     others take over as after a kill.
//   - NATS node restart: connections move to another node; a leader that could not
//     renew for half a TTL stops and takes the lease again when it can.
//   - Store unreachable: the leader serves what it holds, then answers 503.
//   - Graceful stop: the leader stops serving, then writes a released record; a
//     follower takes over at once.
//   - A lease write whose answer is lost (its campaign ended meanwhile, or it timed
//     out) but that was stored: a record of this dispenser's own that no term of it
//     serves (a tag's campaigns run one after another, and a campaign looks at the
//     lease only between its terms). Where the tag is marked, it is taken as a record
//     of our own; where it is not, it is given back at once, by a compare-and-set on
//     its revision.
//   - <prefix>_tagopts lost: every dispenser keeps serving its remembered tags as
//     monotonic and writes their marks back; a dispenser started meanwhile remembers
//     its own, and a live lease record makes a tag monotonic to one that remembers none.
//   - A forged lease record (any inbox, any ttl_ms): not verified, so nothing is
//     forwarded to it; it is taken over by the rules above (two renewals of silence
//     when it names no live dispenser), so the tag answers 503 while it is rewritten and
//     is served again about half a TTL after its writer stopped.
//
// # Tag ranges
//
// The value of a tag in <prefix>_tagopts also holds its range (wire.TagRange: a width,
// and whether the tag is opaque, with its key's fingerprint), which this package keeps
// for the core the way it keeps the marks: watched, remembered in the data dir before a
// tag is served, taken from the deployment record, written back when lost. TagRange is
// the request path's lookup; SetRange writes a range and returns once every dispenser
// has taken it in, refusing while one of them is of a version that knows no ranges
// (ranges.go says how each source counts).
//
// Marks and ranges are keyed by a tag's exact bytes: a MySQL store, whose collation
// would take "Mono" or "mönö" for the row "mono", refuses every spelling but the row's
// own (segment.ErrTagSpelling, a 400), so no other spelling is ever served; the KV store
// keeps them apart as two tags. Pools never serve a monotonic tag, and the
// JetStream pool stream purges the batches it stored for a tag before it was marked:
// both ask IsMonotonic through core.Ordinary, the pools' one segment source.
package monotonic
