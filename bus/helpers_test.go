package bus

import (
	"testing"

	"github.com/leafbus/leafbus/core"
)

// newCore builds the core a test's service answers from: core.DefaultConfig with set
// applied.
func newCore(tb testing.TB, set func(*core.Config)) *core.Core {
	tb.Helper()
	cc := core.DefaultConfig()
	if set != nil {
		set(&cc)
	}
	c, err := core.New(cc)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// adminService is a service with only what the admin calls need, for calling them
// directly.
func adminService(tb testing.TB, tags core.TagStore) *Service {
	tb.Helper()
	return &Service{core: newCore(tb, func(c *core.Config) { c.Tags = tags })}
}
