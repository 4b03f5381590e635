// Package snowflake generates Leaf-snowflake IDs: 63-bit positive integers made of a
// millisecond timestamp, a worker ID and a per-millisecond sequence, so that each worker
// hands out unique, time-ordered IDs without talking to anyone.
//
// The default [Layout] is Twitter's and Leaf's:
//
//	 63  62                                    22 21          12 11            0
//	+---+----------------------------------------+--------------+---------------+
//	| 0 | timestamp: ms since Epoch (41 bits)    | worker (10)  | sequence (12) |
//	+---+----------------------------------------+--------------+---------------+
//	 sign bit, always 0: every ID is a positive int64
//
// What that implies:
//   - 2^12 = 4096 IDs per millisecond per worker (about 4 million a second);
//   - 2^10 = 1024 workers (IDs 0 to 1023), each of which must be held by one process at a time;
//   - 2^41 ms is about 69.7 years from the epoch: Leaf's default epoch,
//     1288834974657 (2010-11-04T01:42:54.657Z), runs out on 2080-07-10T17:30:30.208Z.
//
// The layout is a value handed to [New], not package state, and [Layout.Decode] belongs to
// it, so an ID is decoded with the bits that encoded it.
//
// A [Generator] is one worker's source of IDs. It never repeats an ID because it never issues
// a timestamp below the highest one it issued, whatever the clock says; the clock only decides
// when it refuses. It differs from Leaf's SnowflakeIDGenImpl in these ways:
//   - running out of timestamp bits is [ErrTimestampOverflow]; Leaf shifts the overflowing
//     timestamp into the sign bit and hands out negative IDs;
//   - a backwards step of the clock is measured from the highest clock reading seen, not from
//     the last timestamp issued (which may be ahead of the clock when borrowed), and refusals
//     are errors ([ErrClockBackwards]) rather than exceptions; steps up to MaxBackwardWait
//     (5ms) are still waited out for twice their size, as Leaf does, and each call judges the
//     step afresh, so a large one is refused until the clock has come back to within 5ms of
//     its highest reading;
//   - a Floor (restart safety: the highest timestamp a previous holder of the worker ID may
//     have used) and a ceiling (the timestamp up to which the heartbeat record vouches for
//     this worker) bound what may be issued, and [Generator.Suspend] stops all issuing when the
//     worker-ID lease is lost;
//   - a spent millisecond may move on to the next one ahead of the clock, up to BorrowMax, for
//     pre-filled batches (Leaf always waits; BorrowMax 0 keeps that);
//   - the sequence of each new millisecond still starts at a random 0 to 99 by default, as in
//     Leaf, so that IDs taken one at a time do not all end in sequence 0 and shard evenly by
//     ID modulo; DenseSequence starts at 0 instead.
//
// The package does no I/O: the wall clock is the injected [Clock], and [FakeClock] lets tests
// (here and in other packages) move time by hand.
package snowflake
