// Package testenv starts throwaway real servers for tests: embedded NATS (one node or an
// in-process cluster), MariaDB and ZooKeeper, each private to the test binary, bound to
// 127.0.0.1 on random ports (below the kernel's ephemeral range: FreePort), with its data
// in a temp dir that is removed afterwards.
//
// It never fakes a server and never skips: when a binary is missing the test fails with
// a message that names `make deps`.
package testenv
