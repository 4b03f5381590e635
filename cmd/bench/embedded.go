package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// ErrEmbeddedUnavailable is returned by startEmbedded while the packages an in-process
// dispenser needs (the bus service, the segment store, the snowflake generator) are not
// wired into bench yet.
var ErrEmbeddedUnavailable = errors.New("embedded dispenser not yet available")

// startEmbedded starts a dispenser, with its own embedded NATS server on a loopback port,
// inside this process, so that `bench --embedded` is a one-command test. It returns the
// client URL to load and a stop function that returns once everything it started has
// shut down. It is the only place bench uses leafbus packages beyond bus.ConnConfig:
// everything else speaks the wire protocol to whatever server is given.
func startEmbedded(ctx context.Context, logger *slog.Logger) (url string, stop func(), err error) {
	return "", nil, fmt.Errorf("%w: use --nats with a running dispenser", ErrEmbeddedUnavailable)
}
