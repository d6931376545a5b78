package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// cutSeen is what a Go client saw of a stream whose engine was killed.
type cutSeen struct {
	replica        string
	status         int
	before, after  int // data events before and after the kill
	readErr        error
	done, sseError bool
	endAfterKill   time.Duration
	killed         bool
}

func (c cutSeen) ending() string {
	switch {
	case c.readErr == nil:
		return "clean EOF"
	case errors.Is(c.readErr, context.DeadlineExceeded):
		return "no end within 15 s"
	}
	return "error (" + shortErr(c.readErr) + ")"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// cutWithGo streams a long answer and SIGKILLs the engine serving it after
// ten events.
func cutWithGo(st *stack) (cutSeen, error) {
	var c cutSeen
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	body := chatBody("tell me a very long story about the sea and the ships on it ", 2000, true, "")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	c.status, c.replica = resp.StatusCode, resp.Header.Get("X-Inferrail-Replica")
	e := st.engine(c.replica)
	var killedAt time.Time
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		s := strings.TrimSpace(line)
		var a answer
		scanSSE(&a, []byte(s))
		c.done = c.done || a.done
		c.sseError = c.sseError || a.sseError
		if strings.HasPrefix(s, "data:") {
			if c.killed {
				c.after++
			} else {
				c.before++
			}
		}
		if !c.killed && c.before == 10 && e != nil {
			e.signal(syscall.SIGKILL)
			c.killed, killedAt = true, time.Now()
		}
		if err != nil {
			if err != io.EOF {
				c.readErr = err
			}
			break
		}
	}
	if c.killed {
		c.endAfterKill = time.Since(killedAt)
	}
	return c, nil
}

// sdkSeen is the Node script's report.
type sdkSeen struct {
	Raised    bool   `json:"raised"`
	Error     string `json:"error"`
	ErrorName string `json:"errorName"`
	Chunks    int    `json:"chunks"`
	Finish    string `json:"finish"`
	Replica   string `json:"replica"`
	Hung      bool   `json:"hung"`
}

// cutWithSDK runs stream_cut.mjs (the official OpenAI Node SDK) and kills
// the engine it names once it has read five chunks.
func cutWithSDK(h *harness, st *stack) (sdkSeen, string, error) {
	var s sdkSeen
	script, err := nodeScript()
	if err != nil {
		return s, "", err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return s, "", err
	}
	p, err := spawn("node", filepath.Join(h.tmp, "stream-cut-node.log"), nil, outW,
		[]string{"BASE_URL=" + st.base, "OPENAI_MODULES=" + h.nodeModules}, "node", script)
	outW.Close()
	if err != nil {
		outR.Close()
		return s, "", err
	}
	defer outR.Close()
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	killed := ""
	timeout := time.After(25 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return s, killed, fmt.Errorf("node printed no result (%s)", tail(p.log))
			}
			if name, found := strings.CutPrefix(line, "REPLICA "); found {
				if e := st.engine(name); e != nil {
					e.signal(syscall.SIGKILL)
					killed = name
				}
				continue
			}
			if strings.HasPrefix(line, "{") {
				err := json.Unmarshal([]byte(line), &s)
				p.stop(time.Second)
				return s, killed, err
			}
		case <-timeout:
			p.stop(time.Second)
			return s, killed, errors.New("node did not finish in 25 s")
		}
	}
}

func runStreamCut(h *harness) (result, error) {
	st, err := h.startStack("stream-cut", stackOpts{})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	g, err := cutWithGo(st)
	if err != nil {
		return result{}, err
	}
	goFig := fmt.Sprintf("Go: body ended with %s, SSE error event %s, [DONE] %s", g.ending(), yesNo(g.sseError), yesNo(g.done))
	d := []string{
		fmt.Sprintf("(a) Go client: streaming chat, max_tokens 2000; status %d from replica %q; its engine SIGKILLed after %d events; %d events after; the body read ended with %s %s after the kill; SSE error event: %s; [DONE]: %s.",
			g.status, g.replica, g.before, g.after, g.ending(), ms(g.endAfterKill), yesNo(g.sseError), yesNo(g.done)),
	}
	met := "n/a"
	var sdkFig string
	switch {
	case h.nodeModules == "":
		sdkFig = "SDK: not installed (make node-deps)"
		d = append(d, "(b) skipped: the OpenAI Node SDK is not in .cache/node (make node-deps).")
	default:
		s, killed, err := cutWithSDK(h, st)
		if err != nil {
			sdkFig = "SDK: harness error (" + err.Error() + ")"
			d = append(d, "(b) "+sdkFig)
			break
		}
		raised := "iteration ended normally"
		if s.Raised {
			raised = "raised " + s.ErrorName + ": " + s.Error
		} else if s.Hung {
			raised = "hung (no end within 15 s)"
		}
		sdkFig = "SDK: " + raised
		d = append(d, fmt.Sprintf("(b) OpenAI Node SDK (stream_cut.mjs, for await over chat.completions.create({stream: true})): replica %q, engine %q SIGKILLed after 5 chunks; %d chunks in all, finish_reason %q; %s.",
			s.Replica, killed, s.Chunks, s.Finish, raised))
		met = metWord(s.Raised)
	}
	return result{Figures: goFig + "; " + sdkFig, Met: met, Details: d}, nil
}

// nodeScript finds stream_cut.mjs: under the working directory (the
// repository root), else beside this source file.
func nodeScript() (string, error) {
	script, err := filepath.Abs(filepath.Join("scripts", "hostile", "stream_cut.mjs"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(script); err == nil {
		return script, nil
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		alt := filepath.Join(filepath.Dir(file), "stream_cut.mjs")
		if _, err := os.Stat(alt); err == nil {
			return alt, nil
		}
	}
	return "", fmt.Errorf("%s not found (run from the repository root)", script)
}
