package dispenser

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/oklog/run"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// Run runs every part as one oklog/run group until ctx ends, a signal of WithSignals
// arrives, Close is called, or a part fails; it returns nil on a clean stop and the
// failing part's error otherwise. The parts stop in this order, each waiting for its
// part to finish: stop serving NATS (answering what was delivered), then HTTP (which
// serves until NATS has drained, and then answers what it took), then the core (which
// answers the requests still waiting), then the monotonic
// tags (whose leaders served those requests; their leases are given back), stop
// loading segments and filling pools, write the last heartbeat record and give the
// worker ID back. Close undoes the rest. Run may be called once.
func (d *Dispenser) Run(ctx context.Context) error {
	ctx, err := d.startRun(ctx)
	if err != nil {
		return err
	}
	defer d.endRun()

	var g run.Group
	if len(d.opts.signals) > 0 {
		g.Add(run.SignalHandler(ctx, d.opts.signals...))
	}
	{
		stop := make(chan struct{})
		g.Add(func() error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return nil
			}
		}, func(error) { close(stop) })
	}
	// The recovery watch stops first: what a clean stop takes down (the heartbeat, the
	// connections) is no fault, and a fault is logged at WARN.
	addLoop(&g, "recovery watch", d.recovery.Run)
	{
		stopped := make(chan struct{})
		g.Add(func() error {
			<-stopped
			return nil
		}, func(error) {
			_ = d.svc.Stop() // its error is Close's to report: Stop returns the same every call
			close(stopped)
		})
	}
	if d.http != nil {
		// Interrupted after the service, whose interrupt returns once NATS has drained.
		addLoop(&g, "http", d.http.Run)
	}
	if d.monitor != nil {
		addLoop(&g, "monitor http", d.monitor.Run)
	}
	addLoop(&g, "mixed fleet check", func(ctx context.Context) error {
		d.noteOldPeers(ctx)
		<-ctx.Done()
		return nil
	})
	{
		// Once both faces stopped taking requests: the core refuses new waits and
		// returns when every request still waiting was answered.
		stopped := make(chan struct{})
		g.Add(func() error {
			<-stopped
			return nil
		}, func(error) {
			d.core.Stop()
			close(stopped)
		})
	}
	// After the service and HTTP: the requests they still wait on are forwarded to, or
	// served by, the Manager. It gives its leases back when it stops.
	addLoop(&g, "monotonic tags", d.mono.Run)
	addLoop(&g, "segment loader", d.segments.Run)
	// The pools fill once the tag list and the monotonic marks are in (Ready); before,
	// every segment fill would fail, and say so at WARN.
	addLoop(&g, "batch pools", afterReady(d.ready, d.batches.Run))
	addLoop(&g, "pool stream", afterReady(d.ready, d.poolStream.Run))
	addLoop(&g, "heartbeat", d.heartbeat.Run)
	addLoop(&g, "time responder", d.timeResponder.Run)
	addLoop(&g, "announcer", d.announce)
	addLoop(&g, "deployment record", d.watchDeployment) // deployment.go
	addLoop(&g, "insecure-listen warning", d.warnInsecure)
	err = g.Run()
	switch {
	case errors.Is(err, run.ErrSignal):
		d.log.Info("stopped", "reason", err.Error())
		return nil
	case errors.Is(err, context.Canceled), err == nil:
		d.log.Info("stopped")
		return nil
	}
	return err
}

// startRun marks Run as running and returns the context Close cancels. (The worker
// identity, one of the group's actors, takes the worker ID over: its clean stop gives it
// back.)
func (d *Dispenser) startRun(parent context.Context) (context.Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nil, ErrClosed
	case d.stopRun != nil:
		return nil, errors.New("dispenser: Run called twice")
	}
	ctx, cancel := context.WithCancel(parent)
	d.stopRun = cancel
	return ctx, nil
}

func (d *Dispenser) endRun() {
	d.mu.Lock()
	d.stopRun()
	d.mu.Unlock()
	close(d.runDone)
}

// addLoop adds a background loop to g, stopped by cancelling its context; the interrupt
// returns once the loop has. A loop that ends by itself stops the dispenser with an
// error that names it, never a silent clean exit.
func addLoop(g *run.Group, name string, loop func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	g.Add(func() error {
		defer close(done)
		err := loop(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped by itself")
		}
		return fmt.Errorf("%s: %w", name, err)
	}, func(error) {
		cancel()
		<-done
	})
}

// afterReady runs loop once ready is closed and keeps running until ctx ends, also when
// loop returns at once (pools with nothing configured).
func afterReady(ready <-chan struct{}, loop func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
		if err := loop(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
}

// announce waits until the segment tags and the monotonic marks are loaded (before,
// no tag's mark is known: a segment request waits for them up to WaitMax over NATS and
// is a 503 at once over HTTP), then says how to ask for an
// ID and closes Ready. It stays running until stopped, so that it is an actor like the
// others.
func (d *Dispenser) announce(ctx context.Context) error {
	for _, ready := range []<-chan struct{}{d.segments.Ready(), d.mono.Ready()} {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil
		}
	}
	cfg := d.cfg
	url := client.RedactURLs(d.clientURL)
	d.log.Info("serving", "version", d.build.String(), "nats", url, "http", d.statusURL(), "prefix", cfg.Prefix, "segment_store", cfg.SegmentStore, "worker_registry", cfg.WorkerRegistry)
	if d.opts.banner != nil {
		writeBanner(d.opts.banner, banner{url: url, prefix: cfg.Prefix, statusURL: d.statusURL(), auth: cfg.clientAuth(), version: d.build.String()})
	}
	close(d.ready)
	<-ctx.Done()
	return nil
}

// banner is what the start-up lines say: where the deployment is, its prefix, the
// status page ("" without HTTP) and how clients authenticate.
type banner struct {
	url, prefix, statusURL string
	auth                   clientAuth
	version                string // buildinfo's line; "" leaves the version line out
}

// clientAuth is how clients of this deployment authenticate, as far as this dispenser
// can tell from its own connection: the method of its credentials and its TLS files.
// It holds no secret.
type clientAuth struct {
	method    string // "" (none), "user", "token", "nkey" or "creds"
	tlsCA     string // the CA file that verifies the servers
	mutualTLS bool   // the servers want a client certificate
}

// clientAuth reads the method from the credentials of the JetStream connection.
func (c Config) clientAuth() clientAuth {
	a := clientAuth{tlsCA: c.Conn.TLSCA, mutualTLS: c.Conn.TLSCert != ""}
	switch creds := c.credentials(); {
	case creds.User != "":
		a.method = "user"
	case creds.Token != "":
		a.method = "token"
	case creds.NKeySeedFile != "":
		a.method = "nkey"
	case creds.CredsFile != "":
		a.method = "creds"
	}
	return a
}

// natsFlags are the nats CLI's flags for a user of the deployment's roles
// (deploy/nats-roles.conf): the credential flag, and the inbox prefix an application's
// user needs; and where that user's secret goes.
func (a clientAuth) natsFlags(user string, application bool) (flags, secret string) {
	switch a.method {
	case "user":
		flags, secret = " --user "+user, "its password in NATS_PASSWORD"
	case "token":
		secret = "the deployment's token in NATS_USER"
	case "nkey":
		flags, secret = " --nkey "+user+".nk", "the NKey seed of "+user
	case "creds":
		flags, secret = " --creds "+user+".creds", "the .creds file of "+user
	}
	if application && (a.method == "user" || a.method == "nkey" || a.method == "creds") {
		flags += " --inbox-prefix _INBOX_" + user
	}
	if a.tlsCA != "" {
		flags += " --tlsca " + a.tlsCA
	}
	if a.mutualTLS {
		flags += " --tlscert " + user + ".pem --tlskey " + user + "-key.pem"
	}
	return flags, secret
}

// cliFlags are the dispenser commands' flags for user, and where its secret goes.
func (a clientAuth) cliFlags(user string) (flags, secret string) {
	switch a.method {
	case "user":
		flags, secret = " --user "+user, "its password in LEAFBUS_PASSWORD"
	case "token":
		secret = "the deployment's token in LEAFBUS_TOKEN"
	case "nkey":
		flags, secret = " --nkey "+user+".nk", "the NKey seed of "+user
	case "creds":
		flags, secret = " --creds "+user+".creds", "the .creds file of "+user
	}
	if a.tlsCA != "" {
		flags += " --tls-ca " + a.tlsCA
	}
	if a.mutualTLS {
		flags += " --tls-cert " + user + ".pem --tls-key " + user + "-key.pem"
	}
	return flags, secret
}

// writeBanner tells a newcomer how to ask for IDs with the nats CLI and, when HTTP
// serves, where the status page is. Scripts read these lines: keep them byte for byte.
// When the servers authenticate clients (this dispenser connects with credentials),
// the lines carry the flags of the shipped roles' users (an application's, client-a,
// with its inbox prefix; the operator's for the tag commands) and say where each secret
// goes: never a secret itself.
func writeBanner(w io.Writer, b banner) {
	server := ""
	if b.url != "nats://127.0.0.1:4222" {
		server = " --server " + b.url
	}
	if b.auth.method == "" && b.auth.tlsCA == "" && !b.auth.mutualTLS {
		fmt.Fprintf(w, `leafbus is serving on %s. Ask for IDs with the nats CLI:
  nats%s req %s.segment.%s ""
  nats%s req %s.snowflake.any ""
  nats%s req %s.segment.%s 5      (five IDs)
`, b.url, server, b.prefix, SampleTagName, server, b.prefix, server, b.prefix, SampleTagName)
	} else {
		app, secret := b.auth.natsFlags("client-a", true)
		how := ", over TLS. Ask for IDs with the nats CLI"
		switch b.auth.method {
		case "token":
			how = ", whose servers authenticate clients. Ask for IDs with the nats CLI, " + secret
		case "user", "nkey", "creds":
			how = ", whose servers authenticate clients. Ask for IDs with the nats CLI as an application's user (deploy/nats-roles.conf: client-a, " + secret + ")"
		}
		nats := "nats" + server + app
		fmt.Fprintf(w, `leafbus is serving on %s%s:
  %s req %s.segment.%s ""
  %s req %s.snowflake.any ""
  %s req %s.segment.%s 5      (five IDs)
`, b.url, how, nats, b.prefix, SampleTagName, nats, b.prefix, nats, b.prefix, SampleTagName)
		op, secret := b.auth.cliFlags("operator")
		prefix := ""
		if b.prefix != wire.DefaultPrefix {
			prefix = " --prefix " + b.prefix
		}
		who := "as the operator"
		if secret != "" {
			who += " (" + secret + ")"
		}
		fmt.Fprintf(w, "Manage tags %s:\n  dispenser tag list --nats %s%s%s\n", who, b.url, prefix, op)
	}
	if b.version != "" {
		fmt.Fprintf(w, "version: %s\n", b.version)
	}
	if b.statusURL != "" {
		fmt.Fprintf(w, "status page: %s\n", b.statusURL)
	}
}
