package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// AskAll is how to ask every dispenser something and collect their answers, for any
// client that needs to (the dispenser itself uses it for its peer checks and its status
// page): one request on a subject every dispenser answers without a queue group
// ($SRV.INFO.<prefix>, <prefix>.time), answered on an inbox of its own, with bounds
// built in, so that a rogue responder (thousands of fake dispensers, huge answers, a
// stream that never stops) costs the asker a bounded amount of memory and time:
//
//   - at most MaxAnswers answers are kept; the ask ends when that many came (Answers.More).
//     Where the asker knows which answers it wants (Keep), only those count: a flood of
//     answers it would ignore is read and counted, and cannot push out the ones it wants;
//   - an answer longer than MaxBytes (body and headers) is dropped and counted;
//   - the whole ask takes at most Window, and once an answer it keeps came, Quiet without
//     another ends it (dispensers answer within milliseconds, and together). An answer
//     it does not keep (too long, or refused by Keep: the asker's own, a stranger's)
//     does not start the quiet time, so that the asker's own answer, always the first,
//     cannot end the ask before its peers' answers come on a busy machine;
//   - answers that arrive faster than they are read queue up to twice MaxAnswers x
//     MaxBytes bytes (64 MB at most) in the subscription; more are dropped by nats.go
//     and counted in Answers.Lost.
//
// The protocol's rules come from package wire: the server's "no responders" status
// (wire.NoResponders) ends the ask with no answer, and the inbox must be a reply subject
// the deployment's dispensers answer to (wire.Subjects.ReplyAllowed: never under "$" or
// the prefix), or they would drop every answer unseen.
type AskAll struct {
	// Prefix is the deployment's subject prefix ("leaf"), whose reply rule the inbox
	// must pass.
	Prefix string
	// MaxAnswers is how many answers are kept (0: DefaultAskMaxAnswers).
	MaxAnswers int
	// MaxBytes bounds one answer, its body and headers (0: DefaultAskMaxBytes).
	MaxBytes int
	// Window bounds the whole ask (0: DefaultAskWindow); Quiet is how long without an
	// answer ends it once one was kept (0: DefaultAskQuiet).
	Window, Quiet time.Duration
	// Keep, when set, is asked about every answer within MaxBytes, in the order they
	// come, from Do's goroutine: one it refuses is counted in Answers.Skipped and not
	// kept, nor counted towards MaxAnswers.
	Keep func(*nats.Msg) bool
	// Own, when set, says which answer is the asker's own (its node's, on a subject its
	// node answers too): kept, but like one not kept it does not start the quiet time.
	Own func(*nats.Msg) bool
}

// AskAll defaults. A deployment has at most 1,024 worker IDs (Leaf's layout), so 1,024
// answers hold every dispenser of a real one; a dispenser's $SRV.INFO answer is about
// 2 KB.
const (
	DefaultAskMaxAnswers = 1024
	DefaultAskMaxBytes   = 16 << 10
	DefaultAskWindow     = 2 * time.Second
	DefaultAskQuiet      = 250 * time.Millisecond
)

// Answers is what an AskAll collected.
type Answers struct {
	Msgs []*nats.Msg // in the order they came
	// After[i] is how long after the request Msgs[i] was read (the monotonic clock): a
	// clock in an answer was read at most that long after the request was sent.
	After []time.Duration
	// More is set when the ask stopped at MaxAnswers: others may have answered unread.
	More bool
	// TooLong counts the answers dropped for being longer than MaxBytes; Lost those
	// nats.go dropped because they came faster than they were read; Skipped those
	// AskAll.Keep refused.
	TooLong, Lost, Skipped int
}

// Dropped is how many answers were seen but not kept for a bound (TooLong + Lost); More
// says whether there may have been others.
func (a Answers) Dropped() int { return a.TooLong + a.Lost }

func (a AskAll) withDefaults() AskAll {
	if a.MaxAnswers == 0 {
		a.MaxAnswers = DefaultAskMaxAnswers
	}
	if a.MaxBytes == 0 {
		a.MaxBytes = DefaultAskMaxBytes
	}
	if a.Window == 0 {
		a.Window = DefaultAskWindow
	}
	if a.Quiet == 0 {
		a.Quiet = DefaultAskQuiet
	}
	return a
}

// validate names the first bad bound.
func (a AskAll) validate() error {
	if err := wire.CheckPrefix(a.Prefix); err != nil {
		return fmt.Errorf("ask all: Prefix: %w", err)
	}
	if a.MaxAnswers < 1 || a.MaxBytes < 1 || a.Window <= 0 || a.Quiet <= 0 {
		return fmt.Errorf("ask all: MaxAnswers %d, MaxBytes %d, Window %v, Quiet %v: want each > 0 (0: the default)",
			a.MaxAnswers, a.MaxBytes, a.Window, a.Quiet)
	}
	return nil
}

// maxPendingBytes caps the subscription's queue whatever the bounds: the most an ask
// holds in answers not yet read; maxPendingMsgs is the least count it queues.
const (
	maxPendingBytes = 64 << 20
	maxPendingMsgs  = 1 << 16
)

// Do publishes req (its subject, header and body; Reply is set to a new inbox of nc)
// and collects the answers within the bounds. It returns what came when the window or
// the quiet time ended it, the answers reached MaxAnswers, or the server said no one
// responds, with a nil error. An error means the ask could not be made (bad bounds, an
// inbox the dispensers would not answer, the server refusing the publish or the
// subscription, which wraps nats.ErrPermissionViolation) or ctx ended first (its error,
// wrapped, with the answers so far).
func (a AskAll) Do(ctx context.Context, nc *nats.Conn, req *nats.Msg) (Answers, error) {
	a = a.withDefaults()
	if err := a.validate(); err != nil {
		return Answers{}, err
	}
	inbox := nc.NewInbox()
	if !(wire.Subjects{Prefix: a.Prefix}).ReplyAllowed(inbox) {
		return Answers{}, fmt.Errorf("ask %s: the inbox %s is not a subject the dispensers of prefix %q answer to (PROTOCOL.md \"Reply subjects\"): use another inbox prefix",
			req.Subject, inbox, a.Prefix)
	}
	wctx, cancel := context.WithTimeout(ctx, a.Window)
	defer cancel()
	before := nc.LastError()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return Answers{}, fmt.Errorf("ask %s: %w", req.Subject, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // the inbox is ours alone
	// The bytes bound the memory; the count is generous, so that a burst of small
	// answers is not "a slow consumer" (an asynchronous error the connection logs).
	pendingBytes := min(2*a.MaxAnswers*a.MaxBytes, maxPendingBytes)
	if err := sub.SetPendingLimits(max(2*a.MaxAnswers, maxPendingMsgs), max(pendingBytes, a.MaxBytes)); err != nil {
		return Answers{}, fmt.Errorf("ask %s: %w", req.Subject, err)
	}
	out := *req
	out.Reply = inbox
	sent := time.Now()
	if err := publishChecked(wctx, nc, &out, before); err != nil {
		return Answers{}, fmt.Errorf("ask %s: %w", req.Subject, err)
	}
	var got Answers
	quiet := false // an answer that starts the quiet time came
	end := func(err error) (Answers, error) {
		if n, derr := sub.Dropped(); derr == nil {
			got.Lost = n
		}
		if err != nil {
			err = fmt.Errorf("ask %s: %w", req.Subject, err)
		}
		return got, err
	}
	for {
		var m *nats.Msg
		if !quiet {
			m, err = sub.NextMsgWithContext(wctx)
		} else {
			// Bounded by the window too: a stream of answers cannot hold the ask open.
			wait := a.Quiet
			if dl, ok := wctx.Deadline(); ok {
				wait = min(wait, time.Until(dl))
			}
			if wait <= 0 {
				err = context.DeadlineExceeded
			} else {
				m, err = sub.NextMsg(wait)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, nats.ErrSlowConsumer):
			continue // counted in Lost at the end; the queue goes on
		case errors.Is(err, nats.ErrNoResponders):
			return end(nil)
		case ctx.Err() != nil:
			return end(ctx.Err())
		case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
			return end(nil)
		default:
			return end(err)
		}
		if wire.NoResponders(m.Header, m.Data) {
			return end(nil)
		}
		if msgSize(m) > a.MaxBytes {
			got.TooLong++
			continue
		}
		if a.Keep != nil && !a.Keep(m) {
			got.Skipped++
			continue
		}
		quiet = quiet || a.Own == nil || !a.Own(m)
		got.Msgs = append(got.Msgs, m)
		got.After = append(got.After, time.Since(sent))
		if len(got.Msgs) == a.MaxAnswers {
			got.More = true
			return end(nil)
		}
	}
}

// msgSize is an answer's body and header bytes.
func msgSize(m *nats.Msg) int {
	n := len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return n
}

// publishChecked publishes msg (whose Reply is an inbox the caller subscribed to) and
// makes a round trip to the server. A NATS server refuses a publish or a subscription
// the user may not make with an asynchronous -ERR sent before the round trip's PONG, so
// once the flush returns, nats.go has recorded any refusal as the connection's last
// error; one that names msg's subject or its inbox (and is not before, the last error
// before the subscription) is returned, wrapping nats.ErrPermissionViolation.
func publishChecked(ctx context.Context, nc *nats.Conn, msg *nats.Msg, before error) error {
	if err := nc.PublishMsg(msg); err != nil {
		return err
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return err
	}
	if err := nc.LastError(); err != before && errors.Is(err, nats.ErrPermissionViolation) &&
		(strings.Contains(err.Error(), `"`+msg.Subject+`"`) || strings.Contains(err.Error(), `"`+msg.Reply+`"`)) {
		return fmt.Errorf("%w (the NATS server refused it: check this user's permissions)", err)
	}
	return nil
}
