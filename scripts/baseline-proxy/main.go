// Command baseline-proxy is the plain Go proxy bench-live measures beside
// inferrail live and nginx: net/http's server and Transport (up to 512 idle
// connections per engine), round robin over the engines, the request body
// read whole and the response relayed as it comes, each read flushed. No
// routing, tokenization, index, limits or metrics: about the least a Go
// HTTP proxy does, so the gap between live and nginx can be told apart into
// the language's HTTP stack and live's own work.
//
// With -raw it drops net/http's server and Transport for a loop of its own
// on each connection (net/http's request and response parsers, upstream
// connections pooled by hand, the answer relayed chunk by chunk): no
// goroutine per request beyond the connection's, no background read. That
// is about the least a Go proxy with a goroutine per connection can cost.
// With -burn D as well, it spends D of CPU time on each request (two thirds
// before forwarding it, the rest after the answer), as a proxy with that much
// work of its own would: scripts/tail-cpu.sh compares it with live to tell
// whether live's tail is its CPU or something else.
// It reads what bench sends and trusts it: a measuring tool for loopback,
// never a server for untrusted clients.
//
//	baseline-proxy -listen 127.0.0.1:19087 http://127.0.0.1:19001 http://127.0.0.1:19002
//	baseline-proxy -raw -listen 127.0.0.1:19088 http://127.0.0.1:19001
//	baseline-proxy -raw -burn 35us -listen 127.0.0.1:19089 http://127.0.0.1:19001
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "baseline-proxy:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("baseline-proxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:19087", "address to serve on")
	raw := fs.Bool("raw", false, "serve with a loop of its own on each connection instead of net/http")
	burn := fs.Duration("burn", 0, "with -raw: CPU time to spend on each request besides relaying it (such as 35us)")
	before := fs.Float64("burn-before", 2.0/3, "with -burn: the share of it spent before forwarding (the rest after the answer is written)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("name at least one engine URL, such as http://127.0.0.1:19001")
	}
	var ups, hosts []string
	for _, a := range fs.Args() {
		u, err := url.Parse(a)
		if err != nil || u.Host == "" || u.Scheme != "http" {
			return fmt.Errorf("engine %q: want an http://host:port URL", a)
		}
		ups = append(ups, "http://"+u.Host)
		hosts = append(hosts, u.Host)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400) // as inferrail live
	}
	if *burn < 0 || *burn > time.Second {
		return fmt.Errorf("-burn %v: want 0 to 1s", *burn)
	}
	if *before < 0 || *before > 1 {
		return fmt.Errorf("-burn-before %v: want 0 to 1", *before)
	}
	if *burn > 0 && !*raw {
		return errors.New("-burn needs -raw")
	}
	if *raw {
		return serveRaw(*listen, hosts, *burn, *before)
	}
	p := &proxy{ups: ups, tr: &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 512, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true,
	}}
	srv := &http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

type proxy struct {
	ups  []string
	next atomic.Uint64
	tr   *http.Transport
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	target := p.ups[p.next.Add(1)%uint64(len(p.ups))] + r.URL.RequestURI()
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, k := range []string{"Content-Type", "Accept", "Authorization", "X-Request-Id"} {
		if v := r.Header.Values(k); len(v) > 0 {
			out.Header[k] = v
		}
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		if k != "Connection" && k != "Transfer-Encoding" && k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			rc.Flush()
		}
		if err != nil {
			if err != io.EOF {
				panic(http.ErrAbortHandler) // a broken stream is not a whole one
			}
			return
		}
	}
}
