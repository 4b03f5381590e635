//go:build race

package main

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so pooled
// buffers (the NATS server's among them) allocate, and allocation counts mean little.
const raceEnabled = true
