package chaos

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// report is a run's outcome.
type report struct {
	name       string
	took       time.Duration
	ids, dups  int
	dupSamples []string
	requests   int
	hedged     uint64
	results    []result
	steady     map[string]int
	exits      []string
	rejoins    map[string]int

	mono         monoCheck      // the monotonic tag's promise over the whole run
	monoFailures map[string]int // its requests without IDs, by code
	monoSamples  []string       // answers it may not give
	monoFlags    []string       // what its resumed leaders were seen doing wrong
}

// String formats the report for people: one block per fault.
func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos report (%s): %s\n", r.name, r.took.Round(time.Second))
	fmt.Fprintf(&b, "  IDs checked: %d (%d requests, %d hedged copies); duplicates: %d %v\n", r.ids, r.requests, r.hedged, r.dups, r.dupSamples)
	fmt.Fprintf(&b, "  dispensers that exited by themselves: %d %v\n", len(r.exits), r.exits)
	fmt.Fprintf(&b, "  worker IDs lost and replaced (log lines): %v\n", r.rejoins)
	fmt.Fprintf(&b, "  failures outside faults: %s\n", codes(r.steady))
	fmt.Fprintf(&b, "  monotonic tag %s (lease TTL %s): %d replies (%d IDs) checked against every reply received before each was sent; broken promise: %d, IDs twice: %d; requests without IDs: %s; other faults: %d %v\n",
		monoTag, monoLeaseTTL, r.mono.replies, r.mono.ids, r.mono.broken, r.mono.dups, codes(r.monoFailures), len(r.monoSamples)+len(r.monoFlags), append(r.monoSamples, r.monoFlags...))
	var worstSeg, worstSF, worstMono time.Duration
	for _, res := range r.results {
		fmt.Fprintf(&b, "  - %s\n", res.name)
		rec := res.recovery().Round(time.Millisecond).String() + " after its end" + res.designedNote()
		if !res.recovered {
			rec = "NOT within " + res.recoveryTimeout.String() + " of its end: " + res.notRecovered
		}
		fmt.Fprintf(&b, "      lasted %s; full service %s\n", res.end.Sub(res.start).Round(time.Millisecond), rec)
		fmt.Fprintf(&b, "      failed requests while it lasted: %s of %d; after its end: %s of %d\n",
			codes(res.during), res.requestsDuring, codes(res.after), res.requestsAfter)
		fmt.Fprintf(&b, "      longest gap without service: segment %s, snowflake %s (while it lasted); %s, %s (after)\n",
			res.gapsDuring[wire.Segment].Round(time.Millisecond), res.gapsDuring[wire.Snowflake].Round(time.Millisecond),
			res.gapsAfter[wire.Segment].Round(time.Millisecond), res.gapsAfter[wire.Snowflake].Round(time.Millisecond))
		bound := "reported"
		if res.monoBound {
			bound = "at most " + (2 * monoLeaseTTL).String() + " (2 x TTL) asserted"
		}
		fmt.Fprintf(&b, "      %s: longest gap without a reply %s (%s); %d replies, without IDs: %s; requests sent after its end: %d replies, %d broken; sent while it lasted, received after: %d\n",
			monoTag, res.mono.gap.Round(time.Millisecond), bound, res.mono.replies, codes(res.mono.failures), res.mono.after, res.mono.afterBroken, res.mono.late)
		worstMono = max(worstMono, res.mono.gap)
		for _, s := range res.samples {
			fmt.Fprintf(&b, "      e.g. %s\n", s)
		}
		worstSeg = max(worstSeg, res.gapsDuring[wire.Segment], res.gapsAfter[wire.Segment])
		worstSF = max(worstSF, res.gapsDuring[wire.Snowflake], res.gapsAfter[wire.Snowflake])
	}
	fmt.Fprintf(&b, "  longest gap without service over all faults: segment %s, snowflake %s\n",
		worstSeg.Round(time.Millisecond), worstSF.Round(time.Millisecond))
	fmt.Fprintf(&b, "  longest gap without a %s reply over all faults: %s (lease TTL %s)\n", monoTag, worstMono.Round(time.Millisecond), monoLeaseTTL)
	return b.String()
}

// codes formats failures by kind and code, "none" for none.
func codes(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// save writes the report where LEAFBUS_CHAOS_REPORT names, when it does.
func (r report) save() error {
	path := os.Getenv("LEAFBUS_CHAOS_REPORT")
	if path == "" {
		return nil
	}
	return os.WriteFile(path, []byte(r.String()), 0o644)
}
