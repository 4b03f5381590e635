package dispenser

import (
	"context"
	"time"
)

// insecureWarnEvery is how often a dispenser whose embedded server runs exposed without
// authentication (--insecure-listen) says so again: once at start is easy to miss.
const insecureWarnEvery = time.Minute

// warnInsecure repeats the --insecure-listen warning until ctx ends; with nothing to
// warn about it only waits, an actor like the others.
func (d *Dispenser) warnInsecure(ctx context.Context) error {
	if d.embedded == nil || d.embedded.Insecure() == "" {
		<-ctx.Done()
		return nil
	}
	every := insecureWarnEvery
	if d.opts.insecureWarnEvery > 0 {
		every = d.opts.insecureWarnEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.log.Warn(d.embedded.Insecure())
		}
	}
}
