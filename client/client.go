package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// Client asks dispensers for IDs over NATS request/reply: the protocol of PROTOCOL.md
// in Go. It is safe for concurrent use. Error replies come back as *Error, which
// matches wire.ErrBadRequest, ErrNotFound, ErrConflict, ErrUnavailable and ErrInternal with
// errors.Is; no dispenser running gives nats.ErrNoResponders. A tag that no dispenser
// accepts (wire.CheckTag: empty, too long, not UTF-8, a control character) is refused
// before anything is sent, with the wire.ErrBadRequest a dispenser would answer.
type Client struct {
	nc      *nats.Conn
	subj    wire.Subjects // PROTOCOL.md's subjects under the dispensers' prefix
	timeout time.Duration
	enc     wire.Encoding
	binary  nats.Header   // the header that asks for binary replies; read only, shared by requests
	hedge   time.Duration // 0: never send a request again
	allowed sync.Map      // subjects a request has already reached a dispenser on
	hedged  atomic.Uint64
}

// DefaultHedge is how long an ID request waits for its answer before it is sent again.
// A dispenser answers in well under a millisecond; one that has not answered in 50 ms is
// paused (GC, SIGSTOP, a VM pause) or gone, and another member of the queue group will
// answer the copy.
const DefaultHedge = 50 * time.Millisecond

// ClientOption changes a Client's defaults.
type ClientOption func(*Client) error

// WithPrefix talks to the dispensers of another prefix than "leaf".
func WithPrefix(p string) ClientOption {
	return func(c *Client) error {
		if err := wire.CheckPrefix(p); err != nil {
			return err
		}
		c.subj = wire.Subjects{Prefix: p}
		return nil
	}
}

// WithTimeout bounds calls whose context has no deadline (default 5 s).
func WithTimeout(d time.Duration) ClientOption {
	return func(c *Client) error {
		if d <= 0 {
			return fmt.Errorf("client timeout %v: want > 0", d)
		}
		c.timeout = d
		return nil
	}
}

// WithHedge sets how long an ID or decode request waits for an answer before the client
// sends it again (default DefaultHedge; 0 turns it off). IDs are cheap: an answer that
// comes late to a request already sent again is dropped, and its IDs are a gap, never a
// duplicate. Admin calls are never sent twice.
func WithHedge(d time.Duration) ClientOption {
	return func(c *Client) error {
		if d < 0 {
			return fmt.Errorf("client hedge delay %v: want >= 0 (0: off)", d)
		}
		c.hedge = d
		return nil
	}
}

// WithEncoding sets the reply encoding the client asks for batches in (default
// wire.Binary, the cheaper one to encode and parse; wire.Text is what a human sees with
// `nats req`). A request for one ID asks for text whatever the setting: the header that
// asks for binary costs both ends more to write and parse (nats.go on the dispenser
// makes a map of it) than the few bytes it saves on one ID.
func WithEncoding(e wire.Encoding) ClientOption {
	return func(c *Client) error {
		if e != wire.Text && e != wire.Binary {
			return fmt.Errorf("encoding %d: want Text or Binary", e)
		}
		c.enc = e
		return nil
	}
}

// NewClient returns a client on nc; nc stays the caller's to close.
func NewClient(nc *nats.Conn, opts ...ClientOption) (*Client, error) {
	c := &Client{nc: nc, subj: wire.Subjects{Prefix: wire.DefaultPrefix}, timeout: 5 * time.Second, enc: wire.Binary, hedge: DefaultHedge,
		binary: nats.Header{wire.EncodingHeader: []string{wire.Binary.String()}}}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Segment returns one ID of biz tag tag.
func (c *Client) Segment(ctx context.Context, tag string) (int64, error) {
	return c.one(ctx, wire.Segment, tag)
}

// SegmentN returns n IDs of tag, strictly increasing.
func (c *Client) SegmentN(ctx context.Context, tag string, n int) ([]int64, error) {
	return c.ids(ctx, wire.Segment, tag, n, nil)
}

// Snowflake returns one snowflake ID; tag labels the caller in the dispenser's stats.
func (c *Client) Snowflake(ctx context.Context, tag string) (int64, error) {
	return c.one(ctx, wire.Snowflake, tag)
}

// SnowflakeN returns n snowflake IDs, strictly increasing.
func (c *Client) SnowflakeN(ctx context.Context, tag string, n int) ([]int64, error) {
	return c.ids(ctx, wire.Snowflake, tag, n, nil)
}

// Fill fills dst with len(dst) IDs of the kind and tag, in one request.
func (c *Client) Fill(ctx context.Context, kind wire.Kind, tag string, dst []int64) error {
	_, err := c.ids(ctx, kind, tag, len(dst), dst)
	return err
}

func (c *Client) one(ctx context.Context, kind wire.Kind, tag string) (int64, error) {
	var one [1]int64
	if _, err := c.ids(ctx, kind, tag, 1, one[:]); err != nil {
		return 0, err
	}
	return one[0], nil
}

func (c *Client) ids(ctx context.Context, kind wire.Kind, tag string, n int, dst []int64) ([]int64, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: count %d: want at least 1", wire.ErrBadRequest, n)
	}
	// A tag no dispenser accepts is refused here, with the 400 a dispenser would give:
	// sent, an empty tag is not a subject at all, and the rest cost a round trip.
	if err := wire.CheckTag(tag); err != nil {
		return nil, fmt.Errorf("%s IDs for %s: %w", kind, wire.Quote(tag), err)
	}
	// No nats.NewMsg: its header map is an allocation even when it stays empty.
	msg := &nats.Msg{Subject: c.subj.IDs(kind, tag)}
	enc := wire.Text
	if n > 1 {
		msg.Data = strconv.AppendInt(nil, int64(n), 10)
		enc = c.enc
	}
	if enc == wire.Binary {
		msg.Header = c.binary
	}
	reply, err := c.requestHedged(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("%s IDs for %q: %w", kind, tag, err)
	}
	if dst == nil {
		dst = make([]int64, 0, n)
	}
	ids, err := wire.DecodeIDs(dst[:0], reply.Data, enc)
	if err == nil && len(ids) != n {
		err = fmt.Errorf("%w: %d IDs, asked for %d", wire.ErrBadReply, len(ids), n)
	}
	if err != nil {
		return nil, fmt.Errorf("%s IDs for %q: %w", kind, tag, err)
	}
	return ids, nil
}

// Decode asks a dispenser to take a snowflake ID apart with its layout.
func (c *Client) Decode(ctx context.Context, id int64) (wire.DecodedID, error) {
	var d wire.DecodedID
	msg := &nats.Msg{Subject: c.subj.Decode()}
	msg.Data = strconv.AppendInt(nil, id, 10)
	err := c.callWith(ctx, c.requestHedged, msg, &d)
	if err != nil {
		return wire.DecodedID{}, fmt.Errorf("decode %d: %w", id, err)
	}
	return d, nil
}

// AddTag creates a segment tag (ErrConflict if it exists).
func (c *Client) AddTag(ctx context.Context, r wire.AddTagRequest) (wire.TagInfo, error) {
	var t wire.TagInfo
	err := c.callJSON(ctx, "add", r, &t)
	return t, err
}

// Tags lists the segment tags, sorted by name.
func (c *Client) Tags(ctx context.Context) ([]wire.TagInfo, error) {
	var ts []wire.TagInfo
	err := c.callJSON(ctx, "list", nil, &ts)
	return ts, err
}

// UpdateTag changes a tag's step and/or description (ErrNotFound if it does not exist).
func (c *Client) UpdateTag(ctx context.Context, r wire.UpdateTagRequest) (wire.TagInfo, error) {
	var t wire.TagInfo
	err := c.callJSON(ctx, "update", r, &t)
	return t, err
}

func (c *Client) callJSON(ctx context.Context, op string, body, out any) error {
	msg := &nats.Msg{Subject: c.subj.AdminTags(op)}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("tags %s: %w", op, err)
		}
		msg.Data = b
	}
	if err := c.call(ctx, msg, out); err != nil {
		return fmt.Errorf("tags %s: %w", op, err)
	}
	return nil
}

func (c *Client) call(ctx context.Context, msg *nats.Msg, out any) error {
	return c.callWith(ctx, c.request, msg, out)
}

func (c *Client) callWith(ctx context.Context, request func(context.Context, *nats.Msg) (*nats.Msg, error), msg *nats.Msg, out any) error {
	reply, err := request(ctx, msg)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(reply.Data, out); err != nil {
		return fmt.Errorf("bad reply %q: %w", reply.Data, err)
	}
	return nil
}

// Hedging limits: at most maxCopies copies of one request wait at once, and the pause
// between copies doubles from the hedge delay up to maxHedgeGap. A dispenser that holds
// requests while its store is down (up to 2 s) so gets a handful of copies, not dozens,
// while a hung member of the queue group is still left behind within a few copies.
const (
	maxCopies   = 16
	maxHedgeGap = 500 * time.Millisecond
)

// requestHedged is request for calls that may be answered twice (IDs, decode). The
// request first goes out alone, waiting at most the hedge delay: the path of nearly
// every call, with no goroutine. If nothing came back by then, the dispenser it reached
// is paused, hung or still waiting for a segment, so copies go out at growing intervals
// (see maxCopies), each waiting for the rest of ctx, and the first answer
// of any copy is the answer: IDs, or an error such as a 503 from a dispenser that could
// not load a segment in time. The first, abandoned copy's late answer is dropped: a gap
// in the IDs, never a duplicate. A request that reached no dispenser (no responders) is
// asked once more after the hedge delay, and then that answer stands: while a NATS node
// goes down or a dispenser reconnects, the server a request reached may briefly know no
// member of the queue group, though others serve.
func (c *Client) requestHedged(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	if c.hedge <= 0 {
		return c.request(ctx, msg)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	try, cancel := context.WithTimeout(ctx, c.hedge)
	reply, err := c.request(try, msg)
	cancel()
	if errors.Is(err, nats.ErrNoResponders) {
		select {
		case <-time.After(c.hedge):
		case <-ctx.Done():
			return nil, err
		}
		try, cancel = context.WithTimeout(ctx, c.hedge)
		reply, err = c.request(try, msg)
		cancel()
	}
	if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
		return reply, err
	}
	return c.race(ctx, msg)
}

// race sends copies of msg at growing intervals and returns the first answer.
func (c *Client) race(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the copies still waiting end, and their goroutines with them
	type answer struct {
		reply *nats.Msg
		err   error
	}
	answers := make(chan answer, maxCopies) // never blocks a copy that lost the race
	send := func() {
		c.hedged.Add(1)
		go func() {
			reply, err := c.request(ctx, msg)
			answers <- answer{reply, err}
		}()
	}
	send()
	waiting, gap := 1, c.hedge
	next := time.NewTimer(gap)
	defer next.Stop()
	for {
		select {
		case a := <-answers:
			waiting--
			if a.err == nil || !errors.Is(a.err, context.DeadlineExceeded) && !errors.Is(a.err, context.Canceled) || waiting == 0 && ctx.Err() != nil {
				return a.reply, a.err
			}
		case <-next.C:
			if waiting < maxCopies {
				send()
				waiting++
			}
			gap = min(2*gap, max(c.hedge, maxHedgeGap))
			next.Reset(gap)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Hedged is how many requests this client has sent again because no answer came within
// the hedge delay.
func (c *Client) Hedged() uint64 { return c.hedged.Load() }

// request sends msg and turns a service error reply into *Error. The first request on
// each subject goes the careful way (see checkedRequest), so that a request this
// connection is not allowed to make fails at once, naming the permission, instead of
// timing out; later ones take nats.go's shared-inbox path.
func (c *Client) request(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	var reply *nats.Msg
	var err error
	if _, ok := c.allowed.Load(msg.Subject); ok {
		reply, err = c.nc.RequestMsgWithContext(ctx, msg)
	} else if reply, err = c.checkedRequest(ctx, msg); err == nil {
		c.allowed.Store(msg.Subject, struct{}{})
	}
	if err != nil {
		return nil, err
	}
	if err := wire.ReplyError(reply.Header.Get(wire.ServiceErrorCodeHeader), reply.Header.Get(wire.ServiceErrorHeader)); err != nil {
		return nil, err
	}
	return reply, nil
}

// checkedRequest sends msg on an inbox of its own and makes a round trip to the server
// before waiting for the answer (publishChecked), so that a refusal is an error at once.
func (c *Client) checkedRequest(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	before := c.nc.LastError()
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	out := *msg // hedged copies may share msg: each sends its own
	out.Reply = inbox
	if err := publishChecked(ctx, c.nc, &out, before); err != nil {
		return nil, err
	}
	reply, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, err
	}
	// Without a responder the server answers with a bare 503 status (the
	// no-responders feature); nats.go's own Request turns that into ErrNoResponders.
	if wire.NoResponders(reply.Header, reply.Data) {
		return nil, nats.ErrNoResponders
	}
	return reply, nil
}
