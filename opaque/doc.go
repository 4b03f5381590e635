// Package opaque hides the order of segment IDs: a keyed permutation of the IDs of a
// range [1, 2^Bits-1], so that an opaque tag hands out the image of each segment number
// instead of the number itself. The images are unique because the map is a bijection,
// show no order or density, and only the key takes them back.
//
// The permutation is an unbalanced Feistel network over exactly Bits bits (the two
// halves differ by at most one bit), whose round function is SipHash-1-3 of the half as
// a 4-byte message (a keyed pseudo-random function, as Rust's hash tables use it), keyed
// per round, with cycle-walking past the one value outside the range, 0. The round keys
// are derived from the deployment's key, the tag and the width with HMAC-SHA256, so two
// tags (or two widths) never share a permutation. It resembles NIST's FF1 and FF3-1
// format-preserving encryption in shape (Feistel over a bit string, a keyed PRF per
// round), with a faster round function.
//
// # Six rounds
//
// Luby and Rackoff proved three rounds of independent random functions a pseudo-random
// permutation and four a strong one, but only up to about 2^(Bits/4) queries, which is
// little for the narrow halves of a 53-bit range. Patarin proved five rounds or more
// secure against adaptive chosen plaintext and ciphertext attacks up to nearly
// 2^(Bits/2) queries ("Luby-Rackoff: 5 rounds are enough for 2^(n-ε) security",
// CRYPTO 2003), six up to 2^(Bits/2), and after showing generic attacks on five rounds
// recommends at least six for pseudo-random permutations ("Generic attacks on Feistel
// schemes", ASIACRYPT 2001). Six is that choice; eight, the first choice made before
// measuring, adds no proven bound and cost a third more, over the budget of 50 ns per
// ID (BENCHMARKS.md). Someone who sees IDs has less than those attacks assume: images
// of consecutive numbers it does not know, never a chosen input or output.
//
// This is not encryption of secrets: an ID is not confidential, only its position in the
// sequence is. What the permutation promises is that without the key no one learns the
// order in which IDs were handed out, or how many were.
//
// PermuteAll is Permute for a batch, at about two thirds of the cost per ID: four IDs go
// through the network side by side, and consecutive numbers share their first round.
package opaque
