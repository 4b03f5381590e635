//go:build race

package testutil

// RaceEnabled says the test binary runs under the race detector, whose instrumentation
// allocates and which makes sync.Pool drop items on purpose: allocation counts are not
// checked under it.
const RaceEnabled = true
