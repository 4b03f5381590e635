package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

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
	case errors.Is(err, errTransport):
		return errKeyTransport
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
// Errors: a *wire.Error for a dispenser's error reply (an HTTP error status, with
// --http), nats.ErrNoResponders, errTransport for an HTTP request that got no answer, or
// one that matches wire.ErrBadReply (and wire.ErrOutOfOrder when that is what was wrong).
func parseReply(h nats.Header, data []byte, batch int, enc wire.Encoding, dst []int64) ([]int64, error) {
	if why := h.Get(transportErrorHeader); why != "" {
		return dst, fmt.Errorf("%w: %s", errTransport, why)
	}
	if code := h.Get(wire.ServiceErrorCodeHeader); code != "" {
		return dst, wire.ReplyError(code, h.Get(wire.ServiceErrorHeader))
	}
	if wire.NoResponders(h, data) {
		return dst, nats.ErrNoResponders
	}
	start := len(dst)
	dst, err := wire.DecodeIDs(dst, data, enc)
	if err != nil {
		return dst, err
	}
	if n := len(dst) - start; n != batch {
		return dst[:start], fmt.Errorf("%w: %d IDs, asked for %d", wire.ErrBadReply, n, batch)
	}
	return dst, nil
}
