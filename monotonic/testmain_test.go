package monotonic

import (
	"testing"

	"github.com/leafbus/leafbus/testenv"
)

// TestMain stops the shared MariaDB that the MySQL store test starts.
func TestMain(m *testing.M) { testenv.Main(m) }
