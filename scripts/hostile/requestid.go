package main

import (
	"bytes"
	"encoding"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

const (
	bigIDBytes = 500 << 10
	logSample  = 0.01
	fixedIDs   = 20
	idRepeats  = 3
)

// randomID is n bytes of [a-z0-9].
func randomID(r *rand.Rand, n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}

// sampledID makes an id of n bytes that today's decision log samples at
// any rate: live logs a request when Mix64(FNV-1a(id)) is at most
// sample x 2^64, and a client can search for such an id offline.
func sampledID(r *rand.Rand, n int, sample float64) string {
	limit := uint64(sample * float64(^uint64(0)))
	base := randomID(r, n-8)
	h := fnv.New64a()
	h.Write(base)
	state, _ := h.(encoding.BinaryMarshaler).MarshalBinary()
	for {
		suffix := randomID(r, 8)
		g := fnv.New64a()
		g.(encoding.BinaryUnmarshaler).UnmarshalBinary(state)
		g.Write(suffix)
		if kvblock.Mix64(g.Sum64()) <= limit {
			return string(base) + string(suffix)
		}
	}
}

func runRequestID(h *harness) (result, error) {
	logPath := filepath.Join(h.tmp, "request-id-decisions.jsonl")
	st, err := h.startStack("request-id", stackOpts{decisionLog: logPath, sample: logSample})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	url := st.base + "/v1/chat/completions"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	stream := chatBody("what is the weather like today ", 16, true, "")
	normal := send(client, url, stream, map[string]string{"X-Request-Id": "normal-request-1"}, 10*time.Second, false)

	// The largest id up to 500 KiB the proxy accepts.
	r := rand.New(rand.NewPCG(3, 4))
	size := bigIDBytes
	var big answer
	var id string
	var refusedAt []string
	for size >= 1<<10 {
		id = string(randomID(r, size))
		big = send(client, url, stream, map[string]string{"X-Request-Id": id}, 20*time.Second, true)
		if big.err == nil && big.status != http.StatusRequestHeaderFieldsTooLarge && big.status != http.StatusBadRequest {
			break
		}
		refusedAt = append(refusedAt, fmt.Sprintf("%d B: %s", size, big.outcome()))
		size /= 2
	}
	probe := []byte(id[len(id)/2 : len(id)/2+64])
	echoed := bytes.Count(big.body, probe)
	headerEcho := 0
	if big.header != nil {
		headerEcho = len(big.header.Get("X-Request-Id"))
	}

	// 20 fixed ids of that size, each sent 3 times.
	ids := make([]string, fixedIDs)
	for i := range ids {
		ids[i] = sampledID(r, size, logSample)
	}
	small := chatBody("say one word ", 1, false, "")
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	var mu sync.Mutex
	outcomes := map[string]int{}
	for range idRepeats {
		for _, fid := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				a := send(client, url, small, map[string]string{"X-Request-Id": fid}, 20*time.Second, false)
				mu.Lock()
				outcomes[a.outcome()]++
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // the decision log's writer
	var logSize int64
	if fi, err := os.Stat(logPath); err == nil {
		logSize = fi.Size()
	}
	ds, _ := readDecisions(logPath)
	entries := len(ds)
	sent := fixedIDs*idRepeats + 2

	ok := echoed == 0 && logSize < mib
	ratio := float64(big.bytes) / float64(max(normal.bytes, 1))
	fig := fmt.Sprintf("stream with a %d B id: %d B vs %d B normal (x%.0f), id echoed in %d chunks; decision log %d B (%d entries) after %d requests at sample %g",
		size, big.bytes, normal.bytes, ratio, echoed, logSize, entries, sent, logSample)
	d := []string{
		fmt.Sprintf("Normal: streaming chat, max_tokens 16, x-request-id of 16 bytes: %s, %d bytes of body.", normal.outcome(), normal.bytes),
		fmt.Sprintf("Big id: %d bytes of [a-z0-9] (accepted%s): %s, %d bytes of body, the id found in %d SSE chunks, x-request-id response header %d bytes.",
			size, refusedNote2(refusedAt), big.outcome(), big.bytes, echoed, headerEcho),
		fmt.Sprintf("Decision log at sample %g: %d fixed ids of %d bytes, each chosen so that today's sampler (Mix64 of the id's FNV-1a) logs it, each sent %d times (non-streaming, max_tokens 1: %s); log %d bytes, %d entries (about %.1f expected from %d requests if the client could not choose).",
			logSample, fixedIDs, size, idRepeats, outcomeList(outcomes), logSize, entries, logSample*float64(sent), sent),
		"Goal read as: the id appears in no chunk, and the log stays under 1 MiB.",
	}
	return result{Figures: fig, Met: metWord(ok), Details: d}, nil
}

func refusedNote2(at []string) string {
	if len(at) == 0 {
		return " at the first try"
	}
	return "; refused: " + fmt.Sprint(at)
}
