package live

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/live/config"
)

// sseAnswer is a streamed completion of 16 tokens and its usage, as the
// mock engine writes it, framed in chunks: what the canned engine sends.
func sseAnswer() []byte {
	var events bytes.Buffer
	for i := range 16 {
		fmt.Fprintf(&events, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\" w%d\",\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
	}
	events.WriteString("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":256,\"completion_tokens\":16,\"total_tokens\":272}}\n\n")
	events.WriteString("data: [DONE]\n\n")
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	fmt.Fprintf(&b, "%x\r\n%s\r\n0\r\n\r\n", events.Len(), events.Bytes())
	return b.Bytes()
}

// cannedTCPEngine serves every POST on ln with answer and every other
// request with an empty 200, on keep-alive connections, with a loop of
// its own (little of its cost is counted against the proxy's).
func cannedTCPEngine(ln net.Listener, answer []byte) {
	empty := []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				var post bool
				n := 0
				for first := true; ; first = false {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if first {
						post = bytes.HasPrefix(line, []byte("POST "))
					}
					if len(line) <= 2 {
						break
					}
					if k, v, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(k), "Content-Length") {
						n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
					}
				}
				if _, err := br.Discard(n); err != nil {
					return
				}
				out := empty
				if post {
					out = answer
				}
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		}()
	}
}

// BenchmarkServeLoopback is one streamed completion (a ~256-token
// prompt as bench-live sends, 16 tokens back, each its own event as a real
// engine streams them, where bench-live's engines send a short answer in
// one) through a serving proxy over loopback: the client listener's
// connection loop, edge tokenization, the core's decision with the
// approximate index, the pooled engine connection and the relay, against
// three engines that answer at once from one canned write. It counts what
// the whole path allocates (the client's and engines' loops allocate next
// to nothing) and its latency with every party on the same cores.
func BenchmarkServeLoopback(b *testing.B) {
	answer := sseAnswer()
	c := config.Default()
	c.Log.AccessSample = 0
	c.DrainDelay = 0
	c.Scrape.Interval = time.Hour // no scrape in the measured window
	c.Scrape.MaxAge = 2 * time.Hour
	m := config.DefaultModel()
	m.Name, m.Policy, m.Tokenizer, m.Index = "m", "cost_model", "builtin:sim", "approximate"
	m.MaxConcurrency, m.MaxPending = 1<<20, 1<<20
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go cannedTCPEngine(ln, answer)
		m.Replicas = append(m.Replicas, config.Replica{Name: string(rune('a' + i)), URL: "http://" + ln.Addr().String()})
	}
	c.Models = []config.Model{m}
	c.Listen, c.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	s, err := New(&c, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	defer func() {
		cancel()
		<-done
		s.Close()
	}()
	var ca net.Addr
	for deadline := time.Now().Add(5 * time.Second); ca == nil; {
		if time.Now().After(deadline) {
			b.Fatal("the proxy did not listen within 5s")
		}
		time.Sleep(5 * time.Millisecond)
		ca, _ = s.Addrs()
	}
	cn, err := net.Dial("tcp", ca.String())
	if err != nil {
		b.Fatal(err)
	}
	defer cn.Close()
	br := bufio.NewReaderSize(cn, 64<<10)
	// Prompts of 256 words of the simulator's vocabulary, different in
	// each request (as W6's), so the index keeps learning and evicting.
	reqs := make([][]byte, 256)
	for i := range reqs {
		body := `{"model":"m","prompt":"` + words(i*256%30000, 256) + `","max_tokens":16,"stream":true}`
		reqs[i] = []byte("POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	}
	one := func(i int) {
		if _, err := cn.Write(reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
		status, err := br.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.HasPrefix(status, []byte("HTTP/1.1 200")) {
			b.Fatalf("status %q", status)
		}
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				b.Fatal(err)
			}
			if string(line) == "0\r\n" {
				if _, err := br.Discard(2); err != nil {
					b.Fatal(err)
				}
				return
			}
		}
	}
	for i := range 2 * len(reqs) {
		one(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		one(i)
	}
}
