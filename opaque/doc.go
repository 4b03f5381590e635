// Package opaque hides the order of segment IDs: a keyed permutation of the IDs of a
// range [1, 2^Bits-1], so that an opaque tag hands out the image of each segment number
// instead of the number itself. The images are unique because the map is a bijection,
// show no order or density, and only the key takes them back.
//
// The permutation is an unbalanced Feistel network over exactly Bits bits (the two
// halves differ by at most one bit), whose round function is SipHash-1-3 keyed per round
// (a keyed pseudo-random function, as Rust's and Python's hash tables use it), with
// cycle-walking past the one value outside the range, 0. The round keys are derived
// from the deployment's key, the tag and the width with HMAC-SHA256, so two tags (or two
// widths) never share a permutation. It resembles NIST's FF1 format-preserving
// encryption in shape (Feistel over a bit string, a keyed PRF per round), with a faster
// round function and more rounds than FF1's security argument needs for this domain.
//
// This is not encryption of secrets: an ID is not confidential, only its position in the
// sequence is. What the permutation promises is that without the key no one learns the
// order in which IDs were handed out, or how many were.
package opaque
