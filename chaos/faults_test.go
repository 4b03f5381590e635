package chaos

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// fault is one fault of a run. run causes it and returns when it is over (the process
// restarted or continued, the server back): the fault's end, from which the time to full
// service is measured.
type fault struct {
	name string
	// strict: no request may fail from the fault's start on (the client hedges around
	// a paused or lost dispenser; a NATS node of three is not needed); otherwise only
	// from its end on (after recovery).
	strict bool
	// monoBound: the fault takes the monotonic tag's leader away; the tag must answer
	// again within 2 lease TTLs (the contract's failover bound).
	monoBound bool
	// monoWindow is the shortest time from the fault's start over which the monotonic
	// tag's gap is measured: a gap still open when the window closes counts only up to
	// its end, so the window of a fault aimed at the leader must outlast what it
	// reports, or a tag that never answers again would pass.
	monoWindow time.Duration
	run        func(w *world) time.Time
}

// result is what one fault cost.
type result struct {
	name            string
	strict          bool
	start, end      time.Time
	served          time.Time
	floor           time.Time // the latest clock floor a node restarted by the fault waited for
	recovered       bool
	notRecovered    string
	during, after   map[string]int // failed requests by kind and code
	samples         []string
	gapsDuring      map[wire.Kind]time.Duration
	gapsAfter       map[wire.Kind]time.Duration
	requestsDuring  int
	requestsAfter   int
	recoveryTimeout time.Duration
	monoBound       bool
	mono            monoWindow // what the monotonic tag's clients saw
}

// recovery is the time from the fault's end to full service.
func (r result) recovery() time.Duration { return r.served.Sub(r.end) }

// designedWait is the part of recovery that a restarted node spent waiting for its clock
// to pass its worker ID's last ceiling, which it does by design: after kill -9 nothing
// vouches for the timestamps its last run issued below the ceiling it wrote.
func (r result) designedWait() time.Duration {
	if r.floor.After(r.end) {
		return min(r.floor.Sub(r.end), r.recovery())
	}
	return 0
}

// designedNote says how much of the recovery was the designed wait, if any.
func (r result) designedNote() string {
	if d := r.designedWait(); d > 0 {
		return fmt.Sprintf(" (%s of it a restarted node waiting for its clock to pass its last ceiling, by design; %s beyond)",
			d.Round(time.Millisecond), r.beyondDesign().Round(time.Millisecond))
	}
	return ""
}

// beyondDesign is the time from the fault's end, or from the last floor a restarted node
// waited for if later, to full service: what a recovery bound holds.
func (r result) beyondDesign() time.Duration { return r.recovery() - r.designedWait() }

// settle is how long after full service the run still counts failures as the fault's.
const settle = 2 * time.Second

// inject runs f under load l and measures it: the failures and gaps while it lasts and
// after its end, and the time to full service of every node of the run.
func inject(w *world, l *load, f fault, nodes []string, quiet time.Duration) result {
	w.t.Helper()
	r := result{name: f.name, strict: f.strict, monoBound: f.monoBound, recoveryTimeout: 60 * time.Second}
	during, after := f.name, f.name+" · after"
	l.setPhase(during)
	r.start = time.Now()
	w.t.Logf("chaos: %s", f.name)
	w.takeNotes()
	if leader, _, _ := w.monoLeader(nodes); leader != "" && !f.monoBound {
		w.note(monoTag + " led by " + leader) // whether the fault hits its leader
	}
	r.end = f.run(w)
	if notes := w.takeNotes(); len(notes) > 0 {
		r.name += " (" + strings.Join(notes, "; ") + ")"
	}
	l.setPhase(after)
	r.served, r.recovered, r.notRecovered = w.waitFullService(nodes, r.recoveryTimeout)
	for _, n := range nodes {
		if at := w.floorSince(n, r.start); at.After(r.floor) {
			r.floor = at
		}
	}
	time.Sleep(settle)
	l.setPhase("steady")
	time.Sleep(time.Until(r.start.Add(f.monoWindow)))
	r.mono = w.mono.window(r.start, r.end, time.Now())
	r.during, r.samples = l.failuresIn(during)
	var afterSamples []string
	r.after, afterSamples = l.failuresIn(after)
	r.samples = append(r.samples, afterSamples...)
	r.gapsDuring, r.gapsAfter = l.gapsIn(during), l.gapsIn(after)
	r.requestsDuring, r.requestsAfter = l.requestsIn(during), l.requestsIn(after)
	w.t.Logf("chaos: %s over; full service %s after its end%s; longest gap without a %s reply %s",
		r.name, r.recovery().Round(time.Millisecond), r.designedNote(), monoTag, r.mono.gap.Round(time.Millisecond))
	time.Sleep(quiet)
	return r
}

// kill9 kills name with SIGKILL and starts it again after down.
func kill9(name string, down time.Duration) fault {
	return fault{name: "kill -9 " + name + ", restarted after " + down.String(), strict: true, run: func(w *world) time.Time {
		n := w.proc(name).node
		w.stop(name, syscall.SIGKILL)
		time.Sleep(down)
		w.start(n)
		return time.Now()
	}}
}

// pause stops name with SIGSTOP for d and continues it. With thief set, the pause
// outlasts the lease and thief is restarted meanwhile, taking the lowest free worker ID:
// the paused node's; the paused node then finds its ID taken and must take another.
func pause(name string, d time.Duration, thief string) fault {
	what := "SIGSTOP " + name + " " + d.String()
	if thief != "" {
		what += " (past its lease; " + thief + " restarted meanwhile takes its worker ID), SIGCONT"
	}
	return fault{name: what, strict: true, run: func(w *world) time.Time {
		w.signal(name, syscall.SIGSTOP, false)
		paused := time.Now()
		if thief == "" {
			time.Sleep(d)
		} else {
			time.Sleep(leaseTTL + 1500*time.Millisecond) // the paused node's lease expires
			n := w.proc(thief).node
			w.stop(thief, syscall.SIGTERM)
			w.start(n)
			if _, ok, why := w.waitFullService([]string{thief}, 30*time.Second); !ok {
				w.t.Logf("chaos: %s not serving after its restart: %s", thief, why)
			}
			time.Sleep(time.Until(paused.Add(d)))
		}
		w.signal(name, syscall.SIGCONT, false)
		return time.Now()
	}}
}

// mariaDown stops MariaDB for d.
func mariaDown(d time.Duration) fault {
	return fault{name: "MariaDB down " + d.String(), run: func(w *world) time.Time {
		w.maria.Stop()
		time.Sleep(d)
		w.maria.Start()
		return time.Now()
	}}
}

// natsNodeDown stops NATS node i (of 3) for d and starts it again.
func natsNodeDown(i int, d time.Duration) fault {
	return fault{name: "NATS node n" + string(rune('0'+i)) + " of 3 down " + d.String(), strict: true, run: func(w *world) time.Time {
		w.nats.Nodes[i].Stop()
		time.Sleep(d)
		w.nats.Nodes[i].Start()
		return time.Now()
	}}
}

// zkRestart stops ZooKeeper for d and starts it again, with every client connected.
func zkRestart(d time.Duration) fault {
	return fault{name: "ZooKeeper restarted (down " + d.String() + ")", run: func(w *world) time.Time {
		w.zk.Stop()
		time.Sleep(d)
		w.zk.Start()
		return time.Now()
	}}
}

// sigterm stops name with SIGTERM under load (it drains) and starts it again.
func sigterm(name string) fault {
	return fault{name: "SIGTERM " + name + " under load, restarted", strict: true, run: func(w *world) time.Time {
		n := w.proc(name).node
		w.stop(name, syscall.SIGTERM)
		w.start(n)
		return time.Now()
	}}
}
