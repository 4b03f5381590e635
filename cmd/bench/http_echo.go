package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// `bench http-echo` is the bare HTTP baseline for the dispenser's HTTP face: a plain
// net/http server in a process of its own that answers every request with a fresh
// number, as text/plain with the headers a dispenser sends (Content-Type,
// Content-Length), and does nothing else. Load both with the same tool (wrk, keep-alive)
// and the ratio is what Leaf's API costs in the dispenser over Go's HTTP server itself:
//
//	bench http-echo --listen 127.0.0.1:18090 &
//	dispenser --http 127.0.0.1:18080 ... &
//	wrk -t1 -c1 -d5s --latency http://127.0.0.1:18090/api/segment/get/leaf-segment-test
//	wrk -t1 -c1 -d5s --latency http://127.0.0.1:18080/api/segment/get/leaf-segment-test
//
// (BENCHMARKS.md, "HTTP: the dispenser against a bare net/http server".)

const httpEchoUsage = `bench http-echo is a bare net/http server that answers every request with a
fresh number as text/plain: the baseline of the dispenser's HTTP face. It prints
"ready http://<address>" once it serves, and runs until interrupted.

Flags:
`

// httpEchoContentType is what the dispenser sends with IDs (and Leaf's Spring Boot too).
const httpEchoContentType = "text/plain;charset=UTF-8"

// httpEchoMain is `bench http-echo`.
func httpEchoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench http-echo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, httpEchoUsage)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:18090", "address to serve on (host:port; port 0 picks one)")
	start := fs.Int64("start", 1, "the first number answered")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitTrouble
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench http-echo: unexpected argument %q\n", fs.Arg(0))
		return exitTrouble
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(stderr, "bench http-echo:", err)
		return exitTrouble
	}
	srv := newHTTPEcho(*start)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "ready http://%s\n", ln.Addr())
	select {
	case err := <-errc:
		fmt.Fprintln(stderr, "bench http-echo:", err)
		return exitTrouble
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return exitOK
}

// newHTTPEcho is the baseline server: one handler, the same read-header timeout and
// header bound as the dispenser's, nothing else.
func newHTTPEcho(start int64) *http.Server {
	var next atomic.Int64
	next.Store(start - 1)
	ctype := []string{httpEchoContentType}
	return &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		MaxHeaderBytes:    16 << 10,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			var buf [20]byte
			b := strconv.AppendInt(buf[:0], next.Add(1), 10)
			h := w.Header()
			h["Content-Type"] = ctype
			h["Content-Length"] = []string{strconv.Itoa(len(b))}
			w.WriteHeader(http.StatusOK)
			w.Write(b) //nolint:errcheck // the client went away
		}),
	}
}
