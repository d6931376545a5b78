package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

const firstByteTimeout = 2 * time.Second

// decision is one logged routing decision (one per try).
type decision struct {
	RequestID string `json:"request_id"`
	Replica   string `json:"replica"`
	Prompt    int    `json:"prompt_tokens"`
}

// readDecisions reads a decision log.
func readDecisions(path string) ([]decision, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []decision
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var d decision
		if json.Unmarshal(sc.Bytes(), &d) == nil {
			out = append(out, d)
		}
	}
	return out, sc.Err()
}

// triesOf maps each of ids to the replicas its tries went to, in order:
// by request id when the log holds the clients' ids, else by prompt length
// (request k has the k-th shortest prompt). It says which it used.
func triesOf(ds []decision, ids []string) (map[string][]string, string) {
	byID := map[string][]string{}
	byPrompt := map[int][]string{}
	for _, d := range ds {
		byID[d.RequestID] = append(byID[d.RequestID], d.Replica)
		byPrompt[d.Prompt] = append(byPrompt[d.Prompt], d.Replica)
	}
	out := map[string][]string{}
	for _, id := range ids {
		if t, ok := byID[id]; ok {
			out[id] = t
		}
	}
	if len(out) > 0 {
		return out, "by x-request-id"
	}
	var lens []int
	for n := range byPrompt {
		lens = append(lens, n)
	}
	if len(lens) != len(ids) {
		return out, fmt.Sprintf("unmatched: neither the request ids nor %d distinct prompt lengths are in the log (%d found)", len(ids), len(lens))
	}
	slices.Sort(lens)
	for k, id := range ids {
		out[id] = byPrompt[lens[k]]
	}
	return out, "by prompt length (the log does not hold the clients' request ids)"
}

func runSigstop(h *harness) (result, error) {
	logPath := filepath.Join(h.tmp, "sigstop-decisions.jsonl")
	st, err := h.startStack("sigstop", stackOpts{
		optional:    []optKey{{"first_byte_timeout", firstByteTimeout.String()}},
		decisionLog: logPath, sample: 1,
	})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	const victim = "b"
	e := st.engine(victim)
	e.signal(syscall.SIGSTOP)
	defer e.signal(syscall.SIGCONT)

	const n = 30
	const timeout = 8 * time.Second
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// Request i has i more words than request 0: the decision
			// log's prompt_tokens tell the requests apart.
			body := chatBody("the sigstop scenario asks something "+strings.Repeat("more ", i), 16, true, "")
			answers[i] = send(client, st.base+"/v1/chat/completions", body, map[string]string{"X-Request-Id": fmt.Sprintf("sigstop-%02d", i)}, timeout, false)
		})
		time.Sleep(time.Millisecond) // all at once, in order
	}
	wg.Wait()
	e.signal(syscall.SIGCONT)
	time.Sleep(100 * time.Millisecond) // the decision log's writer
	ds, logErr := readDecisions(logPath)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sigstop-%02d", i)
	}
	tries, matched := triesOf(ds, ids)

	succeeded := 0
	var routed, routedOK, routedFailed []string
	var routedLat []time.Duration
	outcomes := map[string]int{}
	where := map[string]int{}
	for i, a := range answers {
		id := fmt.Sprintf("sigstop-%02d", i)
		good := a.ok() && a.done
		if good {
			succeeded++
			where[a.header.Get("X-Inferrail-Replica")]++
		}
		outcomes[a.outcome()]++
		t := tries[id]
		if len(t) == 0 || t[0] != victim {
			continue
		}
		routed = append(routed, id)
		desc := fmt.Sprintf("%s: tries %s, %s in %s", id, strings.Join(t, ">"), a.outcome(), ms(a.took))
		if good {
			routedOK = append(routedOK, desc)
			routedLat = append(routedLat, a.took)
		} else {
			routedFailed = append(routedFailed, desc)
		}
	}
	fbt := "first_byte_timeout 2s"
	if slices.Contains(st.refused, "first_byte_timeout") {
		fbt = "first_byte_timeout refused by live, run without"
	}
	fig := fmt.Sprintf("%d/%d succeeded; %d first routed to the SIGSTOPped engine: %d succeeded elsewhere", succeeded, n, len(routed), len(routedOK))
	if len(routedLat) > 0 {
		fig += fmt.Sprintf(" (max %s)", ms(percentile(routedLat, 1)))
	}
	if len(routedFailed) > 0 {
		fig += fmt.Sprintf(", %d failed (%s)", len(routedFailed), failedOutcomes(answers, tries, victim))
	}
	fig += "; " + fbt
	d := []string{
		fmt.Sprintf("Engine %s SIGSTOPped (SIGCONT at the end); 30 streaming chat requests at once (1 ms apart), max_tokens 16, each with its own x-request-id, client timeout %s; %s; decision log at sample 1 to see every try.", victim, timeout, fbt),
		fmt.Sprintf("Outcomes: %s; successes by x-inferrail-replica: %s.", outcomeList(outcomes), outcomeList(where)),
		fmt.Sprintf("Decision log: %d tries logged%s; matched to the requests %s.", len(ds), errNote(logErr), matched),
	}
	if len(routedOK) > 0 {
		d = append(d, "Routed to the stopped engine, then served: "+strings.Join(routedOK, "; ")+".")
	}
	if len(routedFailed) > 0 {
		d = append(d, "Routed to the stopped engine, not served: "+strings.Join(routedFailed, "; ")+".")
	}
	met := "n/a"
	if len(routed) > 0 {
		ok := succeeded == n && len(routedFailed) == 0 && percentile(routedLat, 1) <= firstByteTimeout+time.Second
		met = metWord(ok)
	} else {
		d = append(d, "No request was routed to the stopped engine: the goal cannot be judged.")
	}
	if note := refusedNote(st); note != "" {
		d = append(d, note+".")
	}
	return result{Figures: fig, Met: met, Details: d}, nil
}

func failedOutcomes(answers []answer, tries map[string][]string, victim string) string {
	m := map[string]int{}
	for i, a := range answers {
		t := tries[fmt.Sprintf("sigstop-%02d", i)]
		if len(t) > 0 && t[0] == victim && !(a.ok() && a.done) {
			m[a.outcome()]++
		}
	}
	return outcomeList(m)
}
