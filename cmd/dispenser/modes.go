package main

import (
	"errors"
	"flag"
	"fmt"
)

// checkGiven refuses flags that were given, on the command line or as LEAFBUS_<NAME>,
// but that the chosen mode would ignore, for the flags whose default is a real value:
// Config.Validate cannot tell those from "not given" (the settings whose zero means
// "not given" it checks itself). Call it after applyEnv, which marks the flags set from
// the environment as given.
func (c *Config) checkGiven(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if given["listen"] && c.NATS != "" {
		add("--listen is the embedded NATS server's address, and with --nats the dispenser embeds none: drop --listen (with the zk and mysql registries, --advertise is this node's identity)")
	}
	if given["zk-name"] && c.WorkerRegistry != "zk" {
		add("--zk-name is only used with --worker-registry zk (got %s)", c.WorkerRegistry)
	}
	if given["lease-ttl"] && c.WorkerRegistry != "kv" && !(c.WorkerRegistry == "zk" && c.ZKRecycle) {
		add("--lease-ttl is only used with --worker-registry kv, or zk with --zk-recycle (got %s): the other registries hold a worker ID without a lease", c.WorkerRegistry)
	}
	if given["sample-tag"] && c.SampleTag && c.SegmentStore != "kv" {
		add("--sample-tag is only used with --segment-store kv (got %s): add the tag to leaf_alloc, or with `dispenser tag add`", c.SegmentStore)
	}
	return errors.Join(errs...)
}
