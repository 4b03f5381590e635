package dispenser

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// A dispenser often starts together with what it depends on: a NATS cluster whose
// JetStream is still electing its leaders ("no responders"), MySQL or ZooKeeper coming
// up. The steps of New that reach a dependency are therefore tried again, backing off,
// until --start-timeout has passed since New began, each wait logged with its reason.
// What a failed attempt built is undone before the next.
//
// Some failures no wait mends, and New ends at the first of them, saying what to check
// (classify): a refusal for safety (a clock behind its records, a store that went
// back), a configuration that is wrong (a bad DSN, an ID range that does not fit),
// credentials or certificates a server refuses, permissions a NATS user lacks, replicas
// a lone NATS server cannot hold, a ZooKeeper ACL, a MySQL user's missing privileges,
// and a corrupt file in the data dir.

// startRetry spaces the attempts of a step waiting for a dependency.
var startRetry = backoff.Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// startAttemptMax bounds one attempt of a step: a JetStream request that nobody answers
// (no meta leader yet) waits as long as it is let. The steps that take the worker ID
// and check the clock may wait longer on purpose: startWaitMax, on top of the clock's
// own waits, covers a ZooKeeper session awaited (5 s) or another run's alive node
// expiring (a 10 s session).
const (
	startAttemptMax = 4 * time.Second
	startWaitMax    = 12 * time.Second
)

// waitingMsg is the line a start logs each time it waits for a dependency.
const waitingMsg = "waiting for a dependency to become ready"

// waitsForDependency reports whether step reaches a dependency that may still be
// starting. The embedded NATS server is this process's own: a failure to start it is
// not waited out.
func (d *Dispenser) waitsForDependency(step stepName) bool {
	switch step {
	case stepNATS:
		return d.cfg.NATS != ""
	case stepMySQL, stepSegmentStore, stepWorkerRegistry, stepWorkerID, stepClockCheck, stepHeartbeat, stepPools,
		stepDeployment, stepSegmentTags, stepRestoreCheck, stepMonotonicRecord:
		return true
	}
	return false
}

// runStep runs s, and again while it fails for a reason worth waiting out and deadline
// (New's start plus StartTimeout) is not reached. A failure no wait mends ends it at
// once, with what to check in front of the error.
func (d *Dispenser) runStep(ctx context.Context, s step, deadline time.Time) error {
	if !d.waitsForDependency(s.name) {
		return d.explain(s.name, d.attempt(ctx, s, 0))
	}
	retry := backoff.New(startRetry)
	began := time.Now()
	// An attempt may itself wait on its dependency (a request nobody answers, a
	// ZooKeeper session awaited) or on the clock (the guard): it is bounded by the
	// longest such wait, so that a hung attempt is tried again rather than waited for.
	attemptMax := startAttemptMax
	if s.name == stepWorkerID || s.name == stepClockCheck {
		attemptMax = startWaitMax + d.cfg.ClockWaitMax + wire.HeartbeatInterval + d.cfg.clockMargin()
	}
	for {
		mark := len(d.closers)
		err := d.attempt(ctx, s, attemptMax)
		if err == nil {
			if retry.Failures() > 0 {
				d.log.Info("ready after waiting", "step", s.name, "waited", time.Since(began).Round(time.Millisecond), "attempts", retry.Failures()+1)
			}
			return nil
		}
		d.undoSince(mark)
		if ctx.Err() != nil || classify(err) != transient {
			return d.explain(s.name, err)
		}
		wait := retry.Next()
		if time.Now().Add(wait).After(deadline) {
			if retry.Failures() == 1 && d.cfg.StartTimeout == 0 {
				return err
			}
			return fmt.Errorf("not ready within --start-timeout %s (%d attempts): %w", d.cfg.StartTimeout, retry.Failures(), err)
		}
		d.log.Warn(waitingMsg, "step", s.name, "err", err,
			"retry_in", wait.Round(time.Millisecond), "attempt", retry.Failures(), "gives_up_in", time.Until(deadline).Round(time.Second))
		if !backoff.Sleep(ctx, wait) {
			return err
		}
	}
}

// attempt runs s once, bounded by limit when it is not 0. A permissions violation the
// NATS server reports on the JetStream connection meanwhile ends the attempt at once
// and is its error: the request that caused it would only time out.
func (d *Dispenser) attempt(ctx context.Context, s step, limit time.Duration) error {
	actx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	if limit > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, limit)
		defer cancel()
	}
	d.denied.begin(cancelCause)
	err := s.run(actx)
	if denied := d.denied.end(); err != nil && denied != nil {
		return fmt.Errorf("%w (%v)", denied, err)
	}
	return err
}

// undoSince undoes what was registered with onClose from mark on, last first: what a
// failed attempt of a step built.
func (d *Dispenser) undoSince(mark int) {
	for i := len(d.closers) - 1; i >= mark; i-- {
		if err := d.closers[i].undo(); err != nil {
			d.log.Warn("undo a failed attempt", "part", d.closers[i].name, "err", err)
		}
	}
	d.closers = d.closers[:mark]
}

// deniedWatch hears the permissions violations the NATS server reports on the
// dispenser's JetStream connection during a start. Such a violation comes
// asynchronously: the publish or subscription it refused makes the request behind it
// wait for an answer that never comes.
type deniedWatch struct {
	mu     sync.Mutex
	cancel context.CancelCauseFunc // the attempt running; nil between attempts
	err    error                   // the first violation during that attempt
}

// option chains the watch behind the connection's own error handler.
func (w *deniedWatch) option() nats.Option {
	return func(o *nats.Options) error {
		prev := o.AsyncErrorCB
		o.AsyncErrorCB = func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if prev != nil {
				prev(nc, sub, err)
			}
			if errors.Is(err, nats.ErrPermissionViolation) && !optionalDenied(err) {
				w.report(err)
			}
		}
		return nil
	}
}

// optionalDenied reports whether a permissions violation is on a subject the dispenser
// can do without: asking its peers through $SRV (the snowflake layout and worker-ID
// range checks say themselves that they are off where the user may not ask).
func optionalDenied(err error) bool {
	return strings.Contains(err.Error(), `"$SRV.`)
}

func (w *deniedWatch) report(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel == nil || w.err != nil {
		return // not starting (the error handler logged it), or already reported
	}
	w.err = err
	w.cancel(err)
}

func (w *deniedWatch) begin(cancel context.CancelCauseFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel, w.err = cancel, nil
}

// end returns the violation reported since begin, if any.
func (w *deniedWatch) end() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.err
	w.cancel, w.err = nil, nil
	return err
}

// failure is what kind of failure an error is, for the start: worth waiting out or
// not, and what to check.
type failure int

const (
	transient             failure = iota // a dependency not reachable yet, every worker ID taken for now
	refused                              // unsafe or misconfigured, and its message says so
	natsAuth                             // the NATS server refuses the credentials
	natsPermission                       // the NATS user may not use a subject the dispenser needs
	natsNoTLS                            // TLS flags given, and the server does not speak TLS
	serverCertificate                    // the server's certificate does not verify
	clientCertificate                    // the server refuses this client's certificate, or its absence
	replicasBeyondServers                // --kv-replicas beyond what the NATS servers can hold
	corruptDataFile                      // a file of the data dir that does not read back
	zkDenied                             // a ZooKeeper ACL refuses this client
	mysqlDenied                          // the MySQL server refuses the user a database or table
)

// jsReplicasNotSupported is nats-server's JSStreamReplicasNotSupportedErr: replicas > 1
// asked of a server that is not clustered. (A cluster short of servers answers "no
// suitable peers" instead, which a node that is only down also causes, so that one is
// waited out.)
const jsReplicasNotSupported jetstream.ErrorCode = 10074

// refusals are the sentinels of failures whose own message says why no wait mends them,
// besides the worker identity's (workerid.IsRefusal).
var refusals = []error{
	segment.ErrStoreWentBack, segment.ErrNoLeafAlloc, segment.ErrCorruptMarks,
	deployment.ErrMismatch, deployment.ErrCorrupt, ErrDataDirRestored,
	context.Canceled,
}

// classify sorts err by the errors nats.go, JetStream, crypto/tls, go-zookeeper and
// go-sql-driver return (mysqlDeniedErr, in mysql.go).
func classify(err error) failure {
	var apiErr *jetstream.APIError
	var certErr *tls.CertificateVerificationError
	switch {
	case err == nil:
		return transient
	case errors.Is(err, workerid.ErrCorruptCacheFile):
		return corruptDataFile
	case errors.Is(err, nats.ErrPermissionViolation):
		return natsPermission
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired),
		errors.Is(err, nats.ErrNkeysNotSupported):
		return natsAuth
	case errors.Is(err, nats.ErrSecureConnWanted):
		return natsNoTLS
	case errors.As(err, &certErr):
		return serverCertificate
	case isCertificateAlert(err):
		return clientCertificate
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsReplicasNotSupported:
		return replicasBeyondServers
	case workerid.ZKDenied(err):
		return zkDenied
	case mysqlDeniedErr(err):
		return mysqlDenied
	}
	if workerid.IsRefusal(err) {
		return refused
	}
	for _, r := range refusals {
		if errors.Is(err, r) {
			return refused
		}
	}
	return transient
}

// isCertificateAlert reports whether err is the server's refusal of this client's
// certificate: none given where one is required, or one it does not accept. With TLS
// 1.3 the server refuses after the client's side of the handshake is complete, by an
// alert and a close, and which of the two the client sees first is a race: crypto/tls
// reports the alert as a *net.OpError "remote error" around its unexported alert type,
// a uint8 holding the alert's number (RFC 8446, 6.2); nats.go reports the close as
// nats.ErrTLS around io.EOF, EPIPE or ECONNRESET ("connection closed by remote after TLS
// handshake", which it documents as a rejected client certificate). A server that dies
// in the middle of a TLS handshake looks the same; that rare start is refused too.
func isCertificateAlert(err error) bool {
	if errors.Is(err, nats.ErrTLS) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		return true
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return false
	}
	v := reflect.ValueOf(op.Err)
	if v.Kind() != reflect.Uint8 {
		return false
	}
	switch v.Uint() {
	case 42, // bad_certificate
		43,  // unsupported_certificate
		44,  // certificate_revoked
		45,  // certificate_expired
		46,  // certificate_unknown
		48,  // unknown_ca
		49,  // access_denied
		116: // certificate_required
		return true
	}
	return false
}

// explain puts in front of err, a failure of step that ends the start, what to check
// when its class calls for it.
func (d *Dispenser) explain(step stepName, err error) error {
	if err == nil {
		return nil
	}
	if hint := d.hint(step, classify(err)); hint != "" {
		return fmt.Errorf("%s: %w", hint, err)
	}
	return err
}

// hint says what a failure of step of class f means and which flag or file to check;
// "" when the error says it already.
func (d *Dispenser) hint(step stepName, f failure) string {
	cfg := d.cfg
	creds, prefix := Credentials{}, "--"
	if step == stepService && cfg.ServiceAuth.given() {
		creds, prefix = cfg.ServiceAuth, "--service-"
	}
	server := "the NATS server at --nats " + client.RedactURLs(cfg.NATS)
	if cfg.NATS == "" {
		server = "the embedded NATS server"
		if cfg.NATSConfig != "" {
			server += " (--nats-config " + cfg.NATSConfig + ")"
		}
	}
	switch f {
	case natsAuth:
		who := d.describeCreds(creds)
		if who == "no user" {
			return fmt.Sprintf("%s refuses a connection with no credentials: give them with %suser/%spassword, %screds, %snkey or %stoken",
				server, prefix, prefix, prefix, prefix, prefix)
		}
		return fmt.Sprintf("%s refuses %s: check %s (a wait does not change credentials)", server, who, credFlags(creds, cfg.credentials(), prefix))
	case natsPermission:
		return fmt.Sprintf("%s denies %s a subject the dispenser needs: give that user the permissions of user dispenser in deploy/nats-roles.conf (the KV buckets and pool stream of --prefix %s, %s.time and its _INBOX.>)",
			server, d.describeCreds(Credentials{}), cfg.Prefix, cfg.Prefix)
	case natsNoTLS:
		return fmt.Sprintf("--tls-ca/--tls-cert are given but %s does not offer TLS: check --nats, or drop the TLS flags", server)
	case serverCertificate:
		if d.mysqlStep(step) {
			return "the MySQL server's certificate does not verify: check the tls parameter of --mysql-dsn"
		}
		if cfg.Conn.TLSCA == "" {
			return fmt.Sprintf("the certificate of %s is not signed by a CA this host trusts: give its CA with --tls-ca", server)
		}
		return fmt.Sprintf("the certificate of %s does not verify against --tls-ca %s (a CA that did not sign it, or a host name it does not name)", server, cfg.Conn.TLSCA)
	case clientCertificate:
		if d.mysqlStep(step) {
			return "the MySQL server refuses this client's certificate: check the tls parameter of --mysql-dsn"
		}
		if cfg.Conn.TLSCert == "" {
			return fmt.Sprintf("%s wants a client certificate and none was given: give one with --tls-cert/--tls-key", server)
		}
		return fmt.Sprintf("%s refuses the client certificate --tls-cert %s: check it was signed by the CA the server trusts", server, cfg.Conn.TLSCert)
	case replicasBeyondServers:
		return fmt.Sprintf("--kv-replicas %d: %s is not clustered, and keeps one replica: use --kv-replicas 1, or a cluster of at least %d servers",
			cfg.KVReplicas, server, cfg.KVReplicas)
	case corruptDataFile:
		return fmt.Sprintf("--data-dir %s holds a corrupt file (restore it from a backup; remove it only if this node never issued IDs)", cfg.DataDir)
	case zkDenied:
		return fmt.Sprintf("ZooKeeper (--zk %s) refuses this dispenser under /snowflake/%s (an ACL it is not authenticated for): check --zk-name, or that node's ACL", cfg.ZK, cfg.ZKName)
	case mysqlDenied:
		return "--mysql-dsn: the MySQL server refuses its user (password, account, or privileges on the database or a table): check the user and its grants (SELECT, INSERT, UPDATE on leaf_alloc; on leaf_workerid_alloc too with --worker-registry mysql)"
	}
	return ""
}

// mysqlStep reports whether step talks to MySQL with this configuration.
func (d *Dispenser) mysqlStep(step stepName) bool {
	switch step {
	case stepMySQL:
		return true
	case stepSegmentStore:
		return d.cfg.SegmentStore == "mysql"
	case stepWorkerRegistry, stepWorkerID, stepHeartbeat:
		return d.cfg.WorkerRegistry == "mysql"
	}
	return false
}

// credFlags names the flags that gave creds (the connection's own, or conn's when
// creds are none), spelt with prefix.
func credFlags(creds, conn Credentials, prefix string) string {
	if !creds.given() {
		creds = conn
	}
	var flags []string
	for _, m := range creds.methods(prefix) {
		if m == prefix+"user" {
			m += "/" + prefix + "password"
		}
		flags = append(flags, m)
	}
	return strings.Join(flags, ", ")
}
