package chaos

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// nodes are the dispensers a run may start, one or two per registry, each registry with
// a worker-ID range of its own (rangeOf): they share one deployment (one prefix, one
// snowflake ID space).
func nodes() (zkLeaf, zkRecycle, kvA, kvB, mysqlNode node) {
	return node{name: "zk-leaf", registry: "zk", port: 7301},
		node{name: "zk-recycle", registry: "zk-recycle", port: 7302},
		node{name: "kv-a", registry: "kv", port: 7303},
		node{name: "kv-b", registry: "kv", port: 7304},
		node{name: "mysql", registry: "mysql", port: 7305}
}

// scenario is one chaos run: its dispensers, load and faults.
type scenario struct {
	name   string
	nodes  []node
	load   loadSpec
	mono   monoSpec // the clients of the monotonic tag
	warmup time.Duration
	quiet  time.Duration // between faults
	faults []fault
	// recoveryMax is the longest time from a fault's end to full service accepted, not
	// counting the wait of a node restarted after kill -9 for its clock to pass its last
	// ceiling (up to 6 s by default, by design; reported); 0 only reports it.
	recoveryMax time.Duration
}

// TestChaosShort is the chaos suite's CI version: a dispenser per registry, light load,
// five faults (one kills the monotonic tag's leader), about a minute.
func TestChaosShort(t *testing.T) {
	zkLeaf, zkRecycle, kvA, _, mysqlNode := nodes()
	run(t, scenario{
		name:  "short",
		nodes: []node{zkLeaf, zkRecycle, kvA, mysqlNode},
		load: loadSpec{singles: 2, batchers: 1, singleRate: 40, batchRate: 5, batch: 200,
			tags: []string{"chaos-a", "chaos-b"}},
		mono:   monoSpec{clients: 8, rate: 25, maxCount: 5},
		warmup: 3 * time.Second,
		quiet:  2 * time.Second,
		faults: []fault{
			kill9(zkLeaf.name, time.Second),
			killMonoLeader(time.Second),
			pause(kvA.name, 3*time.Second, ""),
			natsNodeDown(1, 3*time.Second),
			zkRestart(2 * time.Second),
		},
		// Full service within 5 s of each fault's end (make chaos holds the full run to
		// 2 s); CI's machine is busier than a chaos run's, so the short run's bound is
		// looser, but a recovery that hangs fails it.
		recoveryMax: 5 * time.Second,
	})
}

// TestChaos is the whole sequence under heavy load (make chaos): five dispensers, every
// fault of issue 13 and the monotonic leader's kill -9, pause and SIGTERM (issue 15) one
// after another, 10 million IDs and more.
func TestChaos(t *testing.T) {
	if os.Getenv("LEAFBUS_CHAOS") != "full" {
		t.Skip("the full chaos run is `make chaos` (LEAFBUS_CHAOS=full)")
	}
	zkLeaf, zkRecycle, kvA, kvB, mysqlNode := nodes()
	run(t, scenario{
		name:  "full",
		nodes: []node{zkLeaf, zkRecycle, kvA, kvB, mysqlNode},
		load: loadSpec{singles: 4, batchers: 2, singleRate: 100, batchRate: 25, batch: 2000,
			tags: []string{"chaos-a", "chaos-b", "chaos-c"}},
		mono:   monoSpec{clients: 16, rate: 40, maxCount: 10},
		warmup: 10 * time.Second,
		quiet:  8 * time.Second,
		faults: []fault{
			kill9(zkLeaf.name, 200*time.Millisecond), // restarted at once, as a supervisor would
			killMonoLeader(200 * time.Millisecond),
			pauseMonoLeader(),
			sigtermMonoLeader(),
			pause(kvA.name, leaseTTL+8*time.Second, kvB.name),
			mariaDown(8 * time.Second),
			natsNodeDown(1, 8*time.Second),
			zkRestart(5 * time.Second),
			sigterm(mysqlNode.name),
			kill9(zkRecycle.name, 2*time.Second),
			natsNodeDown(2, 8*time.Second),
			pause(kvB.name, 5*time.Second, ""),
			kill9(kvA.name, time.Second),
		},
		recoveryMax: 2 * time.Second,
	})
}

// run runs sc and checks what issue 13 asks: no duplicate, no dispenser that exits by
// itself, every fault recovered from (within recoveryMax when set), and no failed
// request where the client's hedging or the cluster's redundancy covers the fault.
func run(t *testing.T, sc scenario) {
	began := time.Now()
	w := newWorld(t)
	w.addTags(append(slices.Clone(sc.load.tags), monoTag)...)
	var names []string
	for _, n := range sc.nodes {
		w.start(n)
		w.waitServing(n.name)
		names = append(names, n.name)
	}
	w.markMonotonic(monoTag, names)
	w.mono = startMono(w, sc.mono)
	l := startLoad(w, sc.load)
	time.Sleep(sc.warmup)
	rep := report{name: sc.name}
	for _, f := range sc.faults {
		rep.results = append(rep.results, inject(w, l, f, names, sc.quiet))
	}
	l.stop()
	w.mono.stop()
	rep.mono, rep.monoSamples, rep.monoFlags = w.mono.check(), w.mono.badSamples(), w.mono.flags()
	rep.monoFailures = w.mono.failureCodes()
	rep.steady, _ = l.failuresIn("steady")
	rep.requests = 0
	for _, r := range rep.results {
		rep.requests += r.requestsDuring + r.requestsAfter
	}
	rep.requests += l.requestsIn("steady")
	rep.hedged = l.cl.Hedged()
	rep.ids, rep.dups, rep.dupSamples = l.check()
	rep.exits = w.unexpectedExits()
	rep.rejoins = w.grepLogs("serving snowflake IDs again with a new worker ID")
	w.stopAll()
	rep.took = time.Since(began)
	t.Log("\n" + rep.String())
	if err := rep.save(); err != nil {
		t.Errorf("save the report: %v", err)
	}
	judge(t, sc, rep)
}

// judge fails the test for what issue 13 does not allow.
func judge(t *testing.T, sc scenario, rep report) {
	if rep.dups > 0 {
		t.Errorf("%d duplicate IDs, e.g. %v", rep.dups, rep.dupSamples)
	}
	for _, e := range rep.exits {
		t.Errorf("a dispenser exited by itself: %s", e)
	}
	for _, r := range rep.results {
		switch {
		case !r.recovered:
			t.Errorf("%s: no full service within %s of its end: %s", r.name, r.recoveryTimeout, r.notRecovered)
		case sc.recoveryMax > 0 && r.beyondDesign() > sc.recoveryMax:
			t.Errorf("%s: full service %s after its end%s, want within %s beyond the designed wait", r.name, r.recovery().Round(time.Millisecond), r.designedNote(), sc.recoveryMax)
		}
		if len(r.after) > 0 {
			t.Errorf("%s: requests failed after its end: %s", r.name, codes(r.after))
		}
		if r.strict && len(r.during) > 0 {
			t.Errorf("%s: requests failed while it lasted: %s (the client hedges, and the cluster has the redundancy)", r.name, codes(r.during))
		}
	}
	judgeMono(t, rep)
	if len(rep.steady) > 0 {
		t.Errorf("requests failed outside any fault: %s", codes(rep.steady))
	}
}

// rangeOf is the worker-ID range of a registry in a run.
func rangeOf(registry string) (lo, hi int) {
	switch registry {
	case "zk":
		return 0, 99
	case "zk-recycle":
		return 100, 199
	case "kv":
		return 200, 299
	}
	return 300, 399
}
