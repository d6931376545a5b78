package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const stalledConns = 20000

// wideAddrs is how many source addresses stalled-bodies-wide spreads its
// connections over: 127.0.0.2 to 127.0.0.65, about 312 each.
const wideAddrs = 64

// runStallWorker opens n connections to addr from addrs source addresses
// in turn (127.0.0.2 on), each sending the headers of a chat request with
// Content-Length 1000 and then 12 body bytes, prints "done OPENED FAILED
// FIRST-ERROR" and holds them until its stdin closes; then it resets them
// all (SO_LINGER 0: no TIME_WAIT left behind).
func runStallWorker(addr string, n, addrs int, stdout io.Writer) int {
	addrs = max(addrs, 1)
	dialers := make([]*net.Dialer, addrs)
	for i := range dialers {
		dialers[i] = &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, byte((2+i)/256), byte((2+i)%256))}}
	}
	msg := []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", addr) + `{"model":"in`)
	var (
		mu       sync.Mutex
		conns    []*net.TCPConn
		firstErr string
		opened   atomic.Int64
		failed   atomic.Int64
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, 64)
	deadline := time.Now().Add(30 * time.Second)
	for i := range n {
		d := dialers[i%addrs]
		if time.Now().After(deadline) {
			failed.Add(1)
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := d.Dial("tcp", addr)
			if err == nil {
				_, err = c.Write(msg)
				if err != nil {
					c.Close()
				}
			}
			if err != nil {
				failed.Add(1)
				mu.Lock()
				if firstErr == "" {
					firstErr = shortErr(err)
				}
				mu.Unlock()
				return
			}
			opened.Add(1)
			mu.Lock()
			conns = append(conns, c.(*net.TCPConn))
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Fprintf(stdout, "done %d %d %s\n", opened.Load(), failed.Load(), strings.ReplaceAll(firstErr, "\n", " "))
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.SetLinger(0)
		c.Close()
	}
	return 0
}

// prober polls one URL every 200 ms on fresh connections, each probe
// given 1 s.
type prober struct {
	url                      string
	mu                       sync.Mutex
	total, answered, timeout int
	worst                    time.Duration
	statuses                 map[int]int
}

func (p *prober) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	p.statuses = map[int]int{}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		wg.Go(func() {
			code, took, err := getStatus(p.url, time.Second)
			p.mu.Lock()
			defer p.mu.Unlock()
			p.total++
			p.worst = max(p.worst, took)
			if err != nil {
				p.timeout++
				return
			}
			p.answered++
			p.statuses[code]++
		})
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

func (p *prober) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var codes []string
	for c, n := range p.statuses {
		codes = append(codes, fmt.Sprintf("%d x%d", c, n))
	}
	return fmt.Sprintf("%d/%d answered (%d timed out), worst %s (statuses %s)", p.answered, p.total, p.timeout, ms(p.worst), list(codes))
}

func runStalledBodies(h *harness, addrs int) (result, error) {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	perProc := int(lim.Cur) - 256
	workers := (stalledConns + perProc - 1) / perProc
	var notes []string
	if int(lim.Max) < stalledConns+256 {
		notes = append(notes, fmt.Sprintf("RLIMIT_NOFILE hard limit %d: one process cannot hold %d connections, so %d worker processes hold %d each; the proxy has the same limit.",
			lim.Max, stalledConns, workers, stalledConns/workers))
	}

	// Flood shedding is off by default (it would shed a load balancer's
	// connections): an operator whose clients connect directly turns it
	// on, as here.
	st, err := h.startStack("stalled-bodies", stackOpts{optional: []optKey{{"flood_connections_per_client", "256"}}})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	pid := st.live.pid()
	client := &prober{url: st.base + probePath(st.base)}
	admin := &prober{url: st.admin + probePath(st.admin, "/replicas")}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { client.run(stop, &wg) })
	wg.Go(func() { admin.run(stop, &wg) })
	fdPeak, rssPeak := fdCount(pid), int64(0)
	// live's view of its client listener's accept queue, and the kernel's
	// count of connection attempts dropped with a queue full (the
	// machine's: the harness runs in the host's network namespace).
	const queueName, queueMaxName, overflowName = `inferrail_listen_queue{listener="client"}`, `inferrail_listen_queue_max{listener="client"}`, "inferrail_listen_overflows_total"
	metricsURL := st.admin + "/metrics"
	overflowsBefore, overflowsOK := gauge(metricsURL, overflowName)
	queueMax, _ := gauge(metricsURL, queueMaxName)
	queuePeak, queueSeen := 0.0, false
	var fdMu sync.Mutex
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			n := fdCount(pid)
			m, _ := readMem(pid)
			q, qok := gauge(metricsURL, queueName)
			fdMu.Lock()
			fdPeak, rssPeak = max(fdPeak, n), max(rssPeak, m.rss)
			if qok {
				queuePeak, queueSeen = max(queuePeak, q), true
			}
			fdMu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	idleFDs := fdCount(pid)
	proxyLimit := fdLimit(pid)

	type worker struct {
		p     *proc
		stdin *os.File
		lines chan string
	}
	var ws []worker
	defer func() {
		for _, w := range ws {
			w.stdin.Close()
		}
	}()
	t0 := time.Now()
	for i := range workers {
		n := stalledConns / workers
		if i == workers-1 {
			n = stalledConns - n*(workers-1)
		}
		inR, inW, err := os.Pipe()
		if err != nil {
			return result{}, err
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			return result{}, err
		}
		p, err := spawn(fmt.Sprintf("stall-worker-%d", i), filepath.Join(h.tmp, fmt.Sprintf("stall-worker-%d.log", i)), inR, outW, nil,
			h.self, "--stall-worker", st.addr, "--stall-n", fmt.Sprint(n), "--stall-addrs", fmt.Sprint(addrs))
		inR.Close()
		outW.Close()
		if err != nil {
			inW.Close()
			outR.Close()
			return result{}, err
		}
		w := worker{p: p, stdin: inW, lines: make(chan string, 4)}
		go func() {
			defer outR.Close()
			sc := bufio.NewScanner(outR)
			for sc.Scan() {
				w.lines <- sc.Text()
			}
			close(w.lines)
		}()
		ws = append(ws, w)
	}
	opened, failed := 0, 0
	var errs []string
	for _, w := range ws {
		select {
		case line, ok := <-w.lines:
			var o, f int
			if n, _ := fmt.Sscanf(line, "done %d %d", &o, &f); ok && n == 2 {
				opened += o
				failed += f
				if rest := strings.SplitN(line, " ", 4); len(rest) == 4 && rest[3] != "" {
					errs = append(errs, rest[3])
				}
			}
		case <-time.After(45 * time.Second):
			errs = append(errs, "a worker did not finish dialing in 45 s")
		}
	}
	openedIn := time.Since(t0)
	time.Sleep(3 * time.Second) // hold
	close(stop)
	wg.Wait()
	for _, w := range ws {
		w.stdin.Close()
	}
	for _, w := range ws {
		select {
		case <-w.p.done:
		case <-time.After(3 * time.Second):
			w.p.stop(time.Second)
		}
	}
	ws = nil
	time.Sleep(500 * time.Millisecond)
	afterCode, _, afterErr := getStatus(client.url, 2*time.Second)
	afterFDs := fdCount(pid)
	accepts := countLines(st.live.log, "Accept error")
	floodLines := countLines(st.live.log, "connection flood")
	overflowsAfter, overflowsAfterOK := gauge(metricsURL, overflowName)
	var closedAt []string // live's count of the connections it closed at accept, by reason
	for _, reason := range []string{"flood", "max_conns_per_client", "max_conns"} {
		if n, ok := gauge(metricsURL, `inferrail_connections_rejected_total{listener="client",reason="`+reason+`"}`); ok {
			closedAt = append(closedAt, fmt.Sprintf("%.0f %s", n, reason))
		}
	}
	closedFig := "not reported"
	if len(closedAt) > 0 {
		closedFig = strings.Join(closedAt, ", ")
	}
	queueFig := "not reported (inferrail_listen_queue: Linux only)"
	if queueSeen {
		queueFig = fmt.Sprintf("peak %.0f of %.0f", queuePeak, queueMax)
	}
	overflowFig := "not reported (inferrail_listen_overflows_total: Linux only)"
	if overflowsOK && overflowsAfterOK {
		overflowFig = fmt.Sprintf("%.0f", overflowsAfter-overflowsBefore)
	}

	bounded := proxyLimit <= 0 || float64(fdPeak) < 0.9*float64(proxyLimit)
	allAnswered := client.answered == client.total && admin.answered == admin.total && client.total > 0
	fig := fmt.Sprintf("%d stalled connections opened (%d failed; closed at accept by live: %s); client %s %s; admin %s %s; proxy fds peak %d (limit %d, idle %d)",
		opened, failed, closedFig, strings.TrimPrefix(client.url, st.base), client.summary(), strings.TrimPrefix(admin.url, st.admin), admin.summary(), fdPeak, proxyLimit, idleFDs)
	from := attackerIP
	if addrs > 1 {
		from = fmt.Sprintf("%d addresses, %s to 127.0.0.%d, in turn", addrs, attackerIP, 1+addrs)
	}
	d := append(notes,
		fmt.Sprintf("Each connection (from %s; the probes come from 127.0.0.1): POST /v1/chat/completions with Content-Length: 1000, then 12 body bytes, then nothing; %d opened in %s by %d worker processes (%d failed%s), held 3 s more.",
			from, opened, ms(openedIn), workers, failed, errList(errs)),
		fmt.Sprintf("Readiness probes every 200 ms on fresh connections, 1 s each: client %s: %s; admin %s: %s.", client.url, client.summary(), admin.url, admin.summary()),
		fmt.Sprintf("Proxy: open fds idle %d, peak %d, 0.5 s after the attack ended %d; RLIMIT_NOFILE %d; RSS peak %s; %d \"Accept error\" lines in its log.", idleFDs, fdPeak, afterFDs, proxyLimit, fmtMiB(rssPeak), accepts),
		fmt.Sprintf("Connections live closed at accept (inferrail_connections_rejected_total, by reason; flood: shed by flood_connections_per_client while the accept queue was an eighth full or more): %s; %d \"connection flood\" lines in its log (a flood begins, is over).", closedFig, floodLines),
		fmt.Sprintf("The client listener's accept queue (inferrail_listen_queue, read every 200 ms): %s; connection attempts the kernel dropped with an accept queue full meanwhile (inferrail_listen_overflows_total, the machine's; a probe whose SYN is dropped is sent again after 1 s): %s.", queueFig, overflowFig),
		fmt.Sprintf("After the attack: %s answered %s.", client.url, statusOrErr(afterCode, afterErr)),
	)
	return result{Figures: fig, Met: metWord(bounded && allAnswered), Details: d}, nil
}

func errList(errs []string) string {
	if len(errs) == 0 {
		return ""
	}
	return "; errors: " + strings.Join(errs, "; ")
}

func statusOrErr(code int, err error) string {
	if err != nil {
		return "error (" + shortErr(err) + ")"
	}
	return fmt.Sprint(code)
}

// countLines counts the lines of a file containing s.
func countLines(path, s string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}
