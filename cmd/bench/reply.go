package main

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// The status NATS itself answers with when nothing subscribes to a request's subject: an
// empty body with this header. nats.go keeps the two names unexported.
const (
	statusHeader       = "Status"
	noRespondersStatus = "503"
)

// ErrOutOfOrder is returned by parseReply when a reply holds IDs that are each valid but do
// not strictly increase. The error also matches wire.ErrBadReply; the bench exits non-zero
// when it sees one, since an ID repeated or going back inside one reply is a broken promise,
// not a malformed body.
var ErrOutOfOrder = errors.New("IDs not strictly increasing")

// orderError is a wire.DecodeIDs error that parseReply found to be an order violation.
type orderError struct{ err error }

func (e *orderError) Error() string        { return e.err.Error() }
func (e *orderError) Unwrap() error        { return e.err }
func (e *orderError) Is(target error) bool { return target == ErrOutOfOrder }

// Keys of the errors-by-code table besides the service codes themselves.
const (
	errKeyNoResponders = "no_responders"
	errKeyTimeout      = "timeout"
	errKeyBadReply     = "bad_reply"
	errKeySend         = "send"
)

// errKey is the row of the errors-by-code table that err is counted in: a dispenser's
// error reply by its code, else no_responders or bad_reply.
func errKey(err error) string {
	var we *wire.Error
	switch {
	case errors.As(err, &we):
		return strconv.Itoa(we.Code)
	case errors.Is(err, nats.ErrNoResponders):
		return errKeyNoResponders
	default:
		return errKeyBadReply
	}
}

// parseReply checks one reply and appends its IDs to dst. The body is wire.DecodeIDs's
// to judge; what is left here is what only the bench knows: the NATS status and the
// error headers around the body, and how many IDs it asked for. A good reply costs no
// allocation beyond dst's growth: this runs once per reply on the hot path of the load
// generator, for the dispenser and the echo baseline alike.
//
// Errors: a *wire.Error for a dispenser's error reply, nats.ErrNoResponders, or one that
// matches wire.ErrBadReply (and ErrOutOfOrder when that is what was wrong).
func parseReply(h nats.Header, data []byte, batch int, enc wire.Encoding, dst []int64) ([]int64, error) {
	if code := h.Get(wire.ServiceErrorCodeHeader); code != "" {
		return dst, wire.ReplyError(code, h.Get(wire.ServiceErrorHeader))
	}
	if len(data) == 0 && h.Get(statusHeader) == noRespondersStatus {
		return dst, nats.ErrNoResponders
	}
	start := len(dst)
	dst, err := wire.DecodeIDs(dst, data, enc)
	if err != nil {
		if outOfOrder(data, enc) {
			err = &orderError{err}
		}
		return dst, err
	}
	if n := len(dst) - start; n != batch {
		return dst[:start], fmt.Errorf("%w: %d IDs, asked for %d", wire.ErrBadReply, n, batch)
	}
	return dst, nil
}

// outOfOrder reports whether a body that wire.DecodeIDs refused holds more than one ID and
// each of them alone is a good reply. DecodeIDs checks that a body is a list of IDs, that
// each is a positive int64 and that they strictly increase; when every ID passes alone,
// the order is what failed. It runs on refused replies only, so it may take its time.
func outOfOrder(body []byte, enc wire.Encoding) bool {
	var one [1]int64
	n := 0
	for field := range replyFields(body, enc) {
		if _, err := wire.DecodeIDs(one[:0], field, enc); err != nil {
			return false
		}
		n++
	}
	return n > 1
}

// replyFields splits a body into the pieces that each hold one ID: the lines of text,
// the eight-byte words of binary (a short tail is a piece of its own, which fails).
func replyFields(body []byte, enc wire.Encoding) iter.Seq[[]byte] {
	if enc == wire.Binary {
		return slices.Chunk(body, 8)
	}
	return bytes.SplitSeq(body, []byte{'\n'})
}
