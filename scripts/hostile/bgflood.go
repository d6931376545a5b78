package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The background flood: one client sends 1,000 Responses API requests
// with background: true, each answered "queued" at once and generated
// after, as fast as it can. Before max_background_responses every one was
// let through (its "queued" answer ended it in the gateway), so the engines
// took all of them; now at most max_background_responses (256 by default)
// are in flight at once, the rest refused with 429 before an engine sees
// them, and a legitimate client's chat requests are still served.
const (
	floodRequests = 1000
	floodWorkers  = 64
	floodBound    = 256 // live's default max_background_responses
	floodLegit    = 30
)

func runBackgroundFlood(h *harness) (result, error) {
	st, err := h.startStack("background-flood", stackOpts{engineArgs: []string{"--responses-store", "4096"}})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	body, _ := json.Marshal(map[string]any{"model": "inferrail-sim", "input": oddWords(21, 40), "max_output_tokens": 2000, "background": true})
	url := st.base + "/v1/responses"
	var queued, refused, other atomic.Int64
	var peakEngines, peakFlight atomic.Int64
	var counted atomic.Bool // live exports inferrail_background_responses_in_flight
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() { // the engines' requests as live last scraped them, and live's own count
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if reps, err := st.replicas(); err == nil {
				n := 0
				for _, r := range reps {
					n += r.Running + r.Waiting
				}
				peakEngines.Store(max(peakEngines.Load(), int64(n)))
			}
			if n, ok := gauge(st.admin+"/metrics", "inferrail_background_responses_in_flight"); ok {
				counted.Store(true)
				peakFlight.Store(max(peakFlight.Load(), int64(n)))
			}
		}
	})
	next := atomic.Int64{}
	var flood sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: floodWorkers}}
	for range floodWorkers {
		flood.Go(func() {
			for next.Add(1) <= floodRequests {
				a := send(client, url, body, nil, 10*time.Second, false)
				switch {
				case a.ok():
					queued.Add(1)
				case a.status == http.StatusTooManyRequests:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	// A legitimate client meanwhile.
	legitOK := 0
	var legitWorst time.Duration
	for i := range floodLegit {
		a := send(nil, st.base+"/v1/chat/completions", chatBody(fmt.Sprintf("hello %d", i), 4, false, "legit"), nil, 30*time.Second, false)
		if a.ok() {
			legitOK++
		}
		legitWorst = max(legitWorst, a.took)
	}
	flood.Wait()
	time.Sleep(time.Second) // the last scrape of the flood
	close(stop)
	watch.Wait()
	flight := "unknown (no inferrail_background_responses_in_flight)"
	if counted.Load() {
		flight = fmt.Sprintf("at most %d", peakFlight.Load())
	}
	ok := counted.Load() && peakFlight.Load() <= floodBound && refused.Load() > 0 && other.Load() == 0 &&
		peakEngines.Load() <= floodBound+floodLegit && legitOK == floodLegit
	fig := fmt.Sprintf("in flight %s (%d queued in all as earlier ones ended, %d refused 429, %d other); engines' requests peak %d; legitimate %d/%d (slowest %.2f s)",
		flight, queued.Load(), refused.Load(), other.Load(), peakEngines.Load(), legitOK, floodLegit, legitWorst.Seconds())
	d := []string{
		fmt.Sprintf("%d workers send %d Responses API requests with background: true and max_output_tokens 2000 as fast as they can; the engines keep responses (--responses-store 4096).", floodWorkers, floodRequests),
		fmt.Sprintf("Answered queued: %d (places free again as earlier ones end); refused with 429 (too_many_background_responses, before an engine saw them): %d; anything else: %d.", queued.Load(), refused.Load(), other.Load()),
		fmt.Sprintf("inferrail_background_responses_in_flight, read every 50 ms: %s (max_background_responses: %d).", flight, floodBound),
		fmt.Sprintf("The engines' running and waiting requests summed, as live scraped them every 50 ms: peak %d (bound: %d background responses and the legitimate client's).", peakEngines.Load(), floodBound),
		fmt.Sprintf("Meanwhile a legitimate client's %d chat requests, one after another: %d served, the slowest in %.2f s.", floodLegit, legitOK, legitWorst.Seconds()),
	}
	return result{Figures: fig, Met: metWord(ok), Details: d}, nil
}

// gauge reads an unlabelled gauge's value from a /metrics page.
func gauge(url, name string) (float64, bool) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
