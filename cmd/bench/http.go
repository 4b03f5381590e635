package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// --http loads any server that speaks Leaf's HTTP API (PROTOCOL.md "HTTP"): leafbus's
// gateway, Leaf itself, another Leaf port. The load generator stays the one of the NATS
// path: a request is "published" by starting a GET on a goroutine of its own, and the
// answer comes back to the worker's reply channel as a message with the NATS shape
// (body, or the error code and reason in the service error headers), so that windows,
// timeouts, latency, --check and the report are the same code for both transports.

// transportErrorHeader carries, on a reply made from an HTTP exchange, why there was no
// HTTP answer at all (connection refused, reset, the client's timeout).
const transportErrorHeader = "Leafbus-Bench-Transport-Error"

// errKeyTransport counts requests that got no HTTP answer at all.
const errKeyTransport = "transport"

// errTransport is parseReply's error for such a reply.
var errTransport = errors.New("no HTTP answer")

// maxHTTPBody bounds a reply body: MaxBatchLimit IDs of the longest text form.
const maxHTTPBody = wire.MaxBatchLimit * wire.MaxTextID

// httpClient is one load client of --http: its own bounded pool of kept-alive
// connections, as a Leaf client's connection pool is (and as a NATS client is a
// connection of its own). A request finding every connection busy waits for one, and
// that wait is part of its latency: in the open loop a slow server shows as latency,
// not as a storm of new connections.
type httpClient struct {
	hc       *http.Client
	tr       *http.Transport
	inFlight sync.WaitGroup // GETs whose goroutine has not ended
}

// newHTTPClient makes a client of at most conns connections, kept alive. A request that
// got no answer within timeout (plus a second) is given up, so that nothing of a run
// outlives it for long; the bench has counted it as a timeout by then.
func newHTTPClient(conns int, timeout time.Duration) *httpClient {
	tr := &http.Transport{
		Proxy:               nil, // a benchmark measures the server, not a proxy of the environment
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // IDs are a few bytes: gzip would cost more than it saves
	}
	return &httpClient{tr: tr, hc: &http.Client{Transport: tr, Timeout: timeout + time.Second}}
}

// send GETs url on a goroutine of its own and delivers the answer, as a message whose
// subject is reply, on out; or drops it once gone is closed (the phase has ended).
func (c *httpClient) send(url, reply string, out chan<- *nats.Msg, gone <-chan struct{}) {
	c.inFlight.Add(1)
	go func() {
		defer c.inFlight.Done()
		m := c.get(url)
		m.Subject = reply
		select {
		case out <- m:
		case <-gone:
		}
	}()
}

// get makes one exchange into a reply: the body for a 200, else the status as the
// service error code with the body (Leaf's one-line reason) as the description.
func (c *httpClient) get(url string) *nats.Msg {
	resp, err := c.hc.Get(url)
	if err != nil {
		return &nats.Msg{Header: nats.Header{transportErrorHeader: {err.Error()}}}
	}
	defer resp.Body.Close()
	body, err := readBody(resp)
	if err != nil {
		return &nats.Msg{Header: nats.Header{transportErrorHeader: {err.Error()}}}
	}
	if resp.StatusCode != http.StatusOK {
		return &nats.Msg{Header: nats.Header{
			wire.ServiceErrorCodeHeader: {strconv.Itoa(resp.StatusCode)},
			wire.ServiceErrorHeader:     {strings.TrimSpace(string(body))},
		}}
	}
	return &nats.Msg{Data: body}
}

// readBody reads the whole body, to its end: a connection whose body was closed before
// the reader saw EOF is not reused, and every request would dial a new one. The buffer
// is sized from the announced length, with room for the read that finds the end.
func readBody(resp *http.Response) ([]byte, error) {
	var buf bytes.Buffer
	if n := resp.ContentLength; n >= 0 && n < maxHTTPBody {
		buf.Grow(int(n) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, maxHTTPBody))
	return buf.Bytes(), err
}

// close waits (in the background) for the GETs in flight to end, drops the kept-alive
// connections and then closes done.
func (c *httpClient) close(done chan<- struct{}) {
	go func() {
		c.inFlight.Wait()
		c.tr.CloseIdleConnections()
		close(done)
	}()
}

// openLoopConns is how many connections each client of an open-loop --http run has:
// at 20,000 requests/s over 4 clients, a 6 ms answer still finds one free.
const openLoopConns = 32

// httpClients makes one HTTP client per load client, with as many connections as it
// keeps requests in flight (closed loop) or openLoopConns.
func httpClients(cfg Config) []*benchConn {
	conns := cfg.Inflight
	if cfg.Rate > 0 {
		conns = openLoopConns
	}
	clients := make([]*benchConn, 0, cfg.Clients)
	for range cfg.Clients {
		clients = append(clients, &benchConn{web: newHTTPClient(conns, cfg.Timeout), closed: make(chan struct{})})
	}
	return clients
}

// leafURL is the URL of Leaf's API for kind and tag under base: one ID, or ?count=n. A
// dotted tag ends with a slash, which keeps Spring (Leaf's and the dispenser's rule)
// from cutting it at its last dot.
func leafURL(base string, kind wire.Kind, tag string, n int) string {
	u := strings.TrimRight(base, "/") + "/api/" + kind.String() + "/get/" + url.PathEscape(tag)
	if strings.Contains(tag, ".") {
		u += "/"
	}
	if n > 1 {
		u += "?count=" + strconv.Itoa(n)
	}
	return u
}

// checkHTTPBase checks --http: an http or https URL with a host and nothing after the
// path (Leaf behind a context path is fine: its paths follow).
func checkHTTPBase(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("--http %q: %v", s, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return fmt.Errorf("--http %q: want a URL such as http://127.0.0.1:8080", s)
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("--http %q: want a base URL without a query or fragment; bench adds Leaf's paths and ?count=", s)
	}
	return nil
}
