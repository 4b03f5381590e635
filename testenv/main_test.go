package testenv_test

import (
	"testing"

	"github.com/leafbus/leafbus/testenv"
)

// TestMain stops the shared MariaDB and ZooKeeper after this package's tests, as every
// package that uses them should.
func TestMain(m *testing.M) { testenv.Main(m) }
