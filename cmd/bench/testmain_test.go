package main

import (
	"os"
	"testing"
)

// envRunAsCommand makes the test binary the bench command: the echo-process tests start
// it as `bench echo`, as bench starts its own binary.
const envRunAsCommand = "LEAFBUS_BENCH_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(envRunAsCommand) == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}
