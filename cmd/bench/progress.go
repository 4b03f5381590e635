package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progressEvery is how often the live line is redrawn.
const progressEvery = 500 * time.Millisecond

// progress redraws one status line on a terminal while a phase runs: elapsed time, the
// rates over the last interval and the totals so far. A nil *progress does nothing, which
// is what a run writing to a file or a pipe gets.
type progress struct {
	out     io.Writer
	label   string
	workers []*worker
	epoch   time.Time
	quit    chan struct{}
	done    chan struct{}
}

// startProgress starts the line on out; out nil means quiet.
func startProgress(out io.Writer, label string, workers []*worker, epoch time.Time) *progress {
	if out == nil {
		return nil
	}
	p := &progress{out: out, label: label, workers: workers, epoch: epoch,
		quit: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

// Stop erases the line and returns once the goroutine has ended.
func (p *progress) Stop() {
	if p == nil {
		return
	}
	close(p.quit)
	<-p.done
	fmt.Fprint(p.out, "\r\x1b[K")
}

func (p *progress) loop() {
	defer close(p.done)
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var prevOK, prevIDs int64
	prevAt := time.Now()
	for {
		select {
		case <-p.quit:
			return
		case now := <-tick.C:
			var sent, ok, errs, ids int64
			for _, w := range p.workers {
				sent += w.live.sent.Load()
				ok += w.live.ok.Load()
				errs += w.live.errs.Load()
				ids += w.live.ids.Load()
			}
			secs := now.Sub(prevAt).Seconds()
			fmt.Fprintf(p.out, "\r\x1b[K[%s] %5.1fs  sent %s  ok %s  %s req/s  %s IDs/s  errors %s",
				p.label, now.Sub(p.epoch).Seconds(), group(sent), group(ok),
				group(int64(float64(ok-prevOK)/secs)), group(int64(float64(ids-prevIDs)/secs)), group(errs))
			prevOK, prevIDs, prevAt = ok, ids, now
		}
	}
}

// terminal reports whether f is an interactive terminal: a character device that is not
// /dev/null. Standard library only, so no dependency for one bit of information.
func terminal(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}
