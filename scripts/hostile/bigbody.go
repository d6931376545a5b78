package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// bigBodyBytes is 31.5 MiB: under live's default 32 MiB body cap.
const bigBodyBytes = 63 << 19

var ordinaryWords = strings.Fields(`the of and to in is you that it he was for on are as with his they
at be this have from or one had by word but not what all were we when your can said there use an each
which she do how their if will up other about out many then them these so some her would make like him
into time has look two more write go see number no way could people my than first water been call who
oil its now find long down day did get come made may part over new sound take only little work know
place year live me back give most very after thing our just name good sentence man think say great where
help through much before line right too mean old any same tell boy follow came want show also around form
three small set put end does another well large must big even such because turn here why ask went men`)

// wordText is n bytes of ordinary words, each followed by a space.
func wordText(r *rand.Rand, n int) []byte {
	b := make([]byte, 0, n)
	for len(b) < n-12 {
		b = append(b, ordinaryWords[r.IntN(len(ordinaryWords))]...)
		b = append(b, ' ')
	}
	for len(b) < n {
		b = append(b, ' ')
	}
	return b
}

// bigChatBody is one chat request of exactly size bytes, a single user
// message of ordinary words.
func bigChatBody(size int) []byte {
	head := `{"model":"inferrail-sim","max_tokens":16,"messages":[{"role":"user","content":"`
	foot := `"}]}`
	r := rand.New(rand.NewPCG(1, 2))
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	b.Write(wordText(r, size-len(head)-len(foot)))
	b.WriteString(foot)
	return b.Bytes()
}

// memPhase is what the proxy's memory did around n big bodies at once.
type memPhase struct {
	codes, msgs  []string
	peak         int64 // the highest VmRSS sampled, during and after
	hwm          int64 // VmHWM at the end
	atAnswer     int64 // VmRSS when the last answer arrived
	after        int64 // VmRSS 5 s later
	answerTook   time.Duration
	before       int64
	samplesTaken int
}

func runBigBody(h *harness) (result, error) {
	st, err := h.startStack("big-body", stackOpts{})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	body := bigChatBody(bigBodyBytes)
	pid := st.live.pid()
	phase := func(n int) memPhase {
		var p memPhase
		m, _ := readMem(pid)
		p.before = m.rss
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for {
				if m, err := readMem(pid); err == nil {
					p.peak = max(p.peak, m.rss)
					p.samplesTaken++
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		})
		codes, msgs := make([]string, n), make([]string, n)
		t0 := time.Now()
		var sends sync.WaitGroup
		for i := range n {
			sends.Go(func() { codes[i], msgs[i] = postStatus(st.base+"/v1/chat/completions", body, 60*time.Second) })
		}
		sends.Wait()
		p.answerTook = time.Since(t0)
		m, _ = readMem(pid)
		p.atAnswer = m.rss
		time.Sleep(5 * time.Second)
		m, _ = readMem(pid)
		p.after, p.hwm = m.rss, m.hwm
		close(stop)
		wg.Wait()
		p.peak = max(p.peak, p.after)
		p.codes, p.msgs = codes, msgs
		return p
	}
	idle, _ := readMem(pid)
	one := phase(1)
	two := phase(2)
	const limit = 256 * mib
	const noise = 4 * mib
	ok := two.hwm < limit && one.after <= one.atAnswer+noise && two.after <= two.atAnswer+noise
	fig := fmt.Sprintf("1 body: %s, peak RSS %s, 5 s after %s; 2 at once: %s, peak RSS %s, 5 s after %s; VmHWM %s",
		strings.Join(one.codes, " "), fmtMiB(one.peak), fmtMiB(one.after),
		strings.Join(two.codes, " "), fmtMiB(two.peak), fmtMiB(two.after), fmtMiB(two.hwm))
	d := []string{
		fmt.Sprintf("Body: %d bytes (31.5 MiB), one user message of ordinary words, max_tokens 16; sent over HTTP/1.1 with Content-Length.", len(body)),
		fmt.Sprintf("Proxy RSS idle: %s.", fmtMiB(idle.rss)),
		fmt.Sprintf("One body: answered %s in %s; RSS before %s, peak %s, at the answer %s, 5 s after %s; VmHWM %s.",
			strings.Join(one.codes, " "), ms(one.answerTook), fmtMiB(one.before), fmtMiB(one.peak), fmtMiB(one.atAnswer), fmtMiB(one.after), fmtMiB(one.hwm)),
		fmt.Sprintf("Two at once: answered %s in %s; RSS before %s, peak %s, at the answers %s, 5 s after %s; VmHWM %s.",
			strings.Join(two.codes, " "), ms(two.answerTook), fmtMiB(two.before), fmtMiB(two.peak), fmtMiB(two.atAnswer), fmtMiB(two.after), fmtMiB(two.hwm)),
		"Answers (first 200 bytes): " + strings.Join(slices.Compact(append(one.msgs, two.msgs...)), " / "),
		"Goal read as: VmHWM (the kernel's peak RSS since start) under 256 MiB, and RSS 5 s after each round not above its value when the answers arrived (4 MiB of slack).",
	}
	return result{Figures: fig, Met: metWord(ok), Details: d}, nil
}

// postStatus POSTs body on a fresh connection and returns the status code
// (or the error) and the start of the answer.
func postStatus(url string, body []byte, timeout time.Duration) (string, string) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := http.Client{Timeout: timeout, Transport: tr}
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return "error (" + shortErr(err) + ")", ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return fmt.Sprint(resp.StatusCode), strings.Join(strings.Fields(string(b)), " ")
}

// shortErr is the last part of an error chain.
func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s)-i > 8 {
		s = s[i+2:]
	}
	return s
}
