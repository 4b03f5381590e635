package testenv_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/leafbus/leafbus/testenv"
)

// TestSharedServersParallel runs parallel tests against the shared servers: under -race
// it checks the shared accessors, and that names handed out concurrently never repeat.
func TestSharedServersParallel(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	record := func(t *testing.T, name string) {
		mu.Lock()
		defer mu.Unlock()
		if seen[name] {
			t.Errorf("%q handed out twice", name)
		}
		seen[name] = true
	}
	t.Run("group", func(t *testing.T) {
		for i := range 8 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				record(t, testenv.MariaDB(t).NewDatabase(t))
				record(t, testenv.ZooKeeper(t).NewRoot(t))
			})
		}
	})
	if len(seen) != 16 {
		t.Errorf("%d distinct names, want 16", len(seen))
	}
}
