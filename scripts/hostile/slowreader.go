package main

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

const (
	// defaultMaxConcurrency is live's per-replica cap of requests in
	// flight (models[].max_concurrency), which the generated
	// configuration leaves at its default.
	defaultMaxConcurrency = 256
	// streamsPerConn stays under the 250 concurrent streams Go's HTTP/2
	// server allows by default.
	streamsPerConn = 200
)

func runSlowReader(h *harness) (result, error) {
	st, err := h.startStack("slow-reader", stackOpts{})
	if err != nil {
		return result{}, err
	}
	defer st.stop()

	// Enough streams to hold every replica slot, and some.
	target := 3*defaultMaxConcurrency + 32
	nconn := (target + streamsPerConn - 1) / streamsPerConn
	var attackers []*h2Reader
	defer func() {
		for _, a := range attackers {
			a.close()
		}
	}()
	opened, failed := 0, 0
	var firstErr error
	for i := range nconn {
		a, err := dialH2Reader(st.addr)
		if err != nil {
			firstErr = err
			failed += streamsPerConn
			continue
		}
		attackers = append(attackers, a)
		for j := range streamsPerConn {
			prompt := fmt.Sprintf("slow reader %d %d never reads a single token of this answer ", i, j)
			body := chatBody(prompt, 4000, true, "")
			err := a.post(st.addr, "/v1/chat/completions", body, [][2]string{
				{"content-type", "application/json"},
				{"content-length", fmt.Sprint(len(body))},
				{"x-inferrail-tenant", "slow-reader"},
			})
			if err != nil {
				firstErr = err
				failed += streamsPerConn - j
				break
			}
			opened++
		}
	}
	// Let the proxy take them in: wait until what it holds stops growing.
	held, queued := 0, 0
	last, stable := -1, 0
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) && stable < 5 {
		time.Sleep(200 * time.Millisecond)
		reps, err := st.replicas()
		if err != nil {
			continue
		}
		held, queued = 0, 0
		for _, r := range reps {
			held += r.InFlight
			queued = r.Queued
		}
		if held+queued == last {
			stable++
		} else {
			stable = 0
		}
		last = held + queued
	}
	var headers, resets, data int64
	for _, a := range attackers {
		headers += a.headers.Load()
		resets += a.resets.Load()
		data += a.dataBytes.Load()
	}

	// 50 legitimate streams, each on a fresh connection, all at once.
	const legit = 50
	const timeout = 10 * time.Second
	answers := make([]answer, legit)
	var wg sync.WaitGroup
	for i := range legit {
		wg.Go(func() {
			body := chatBody(fmt.Sprintf("legitimate user %d asks a short question ", i), 16, true, "")
			answers[i] = send(nil, st.base+"/v1/chat/completions", body, map[string]string{"X-Inferrail-Tenant": "legit"}, timeout, false)
		})
	}
	wg.Wait()
	served := 0
	var lat []time.Duration
	outcomes := map[string]int{}
	for _, a := range answers {
		if a.ok() && a.done {
			served++
			lat = append(lat, a.took)
		}
		outcomes[a.outcome()]++
	}
	fig := fmt.Sprintf("%d/%d legitimate served (%s); held by %d never-reading h2c streams on %d connections: %d in flight, %d queued",
		served, legit, outcomeList(outcomes), opened, len(attackers), held, queued)
	if served > 0 {
		fig += fmt.Sprintf("; served p50 %s, max %s", ms(percentile(lat, 0.5)), ms(percentile(lat, 1)))
	}
	d := []string{
		fmt.Sprintf("Attack: %d h2c connections from %s (prior knowledge), SETTINGS_INITIAL_WINDOW_SIZE 0, never a WINDOW_UPDATE; %d streaming chat requests with max_tokens 4000 (%d could not be sent%s).",
			len(attackers), attackerIP, opened, failed, errNote(firstErr)),
		fmt.Sprintf("The server sent %d response HEADERS, %d RST_STREAM and %d body bytes to the attackers.", headers, resets, data),
		fmt.Sprintf("Proxy's own view (/replicas) once stable: %d requests in flight on the replicas, %d queued (3 replicas x max_concurrency %d = %d slots).", held, queued, defaultMaxConcurrency, 3*defaultMaxConcurrency),
		"Each held stream reserves its max_tokens in KV blocks (kv admission, the default), so the replicas fill before max_concurrency does; the rest wait in the queue (timeout 30 s by default) ahead of the legitimate requests' turn.",
		fmt.Sprintf("Legitimate: %d streaming chat requests, max_tokens 16, tenant legit, HTTP/1.1 on fresh connections from 127.0.0.1, client timeout %s: %s.", legit, timeout, outcomeList(outcomes)),
	}
	if served > 0 {
		d = append(d, fmt.Sprintf("Served latency (whole stream): p50 %s, p90 %s, max %s.", ms(percentile(lat, 0.5)), ms(percentile(lat, 0.9)), ms(percentile(lat, 1))))
	}
	return result{Figures: fig, Met: metWord(served == legit), Details: d}, nil
}

func outcomeList(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return "; first error: " + shortErr(err)
}
