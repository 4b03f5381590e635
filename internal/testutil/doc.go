// Package testutil holds the helpers the tests of every leafbus package share: a logger
// whose lines go to t.Log, a buffer safe to write from one goroutine while the test
// reads it, a system clock moved by an offset, a bounded context, a bounded wait for a
// condition, a background actor stopped at cleanup, and the error check of a table row.
//
// It is what raft's testing.go and WTF Dial's test helpers are to their packages,
// written once instead of per package. Only _test.go files import it; it imports the
// standard library alone, so that any package's internal tests can use it without an
// import cycle. Real servers come from package testenv, not from here.
package testutil
