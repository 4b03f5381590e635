package bus

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyPoll is how often waitReady looks at the server while it starts.
const readyPoll = 20 * time.Millisecond

// waitReady waits until srv accepts clients, at most within. nats-server reports a
// failure to start (a port taken, a JetStream dir it cannot use) only in its log, with
// Fatalf, and otherwise leaves ReadyForConnections to time out: with a taken --listen
// port the start used to wait the whole 30 s. The first fatal line ends the wait at once
// and is the error.
func waitReady(srv *server.Server, fatal <-chan string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for !srv.ReadyForConnections(readyPoll) {
		select {
		case msg := <-fatal:
			return errors.New(msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v", within)
		}
	}
	return nil
}

// fatalf logs a fatal line of the server and hands the first one to waitReady.
func (s *serverLogger) fatalf(msg string) {
	s.l.Error(msg)
	select {
	case s.fatal <- msg:
	default:
	}
}
