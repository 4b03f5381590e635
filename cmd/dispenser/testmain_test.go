package main

import (
	"testing"

	"github.com/leafbus/leafbus/testenv"
)

// TestMain stops the shared MariaDB and ZooKeeper that tests of this package start.
func TestMain(m *testing.M) { testenv.Main(m) }
