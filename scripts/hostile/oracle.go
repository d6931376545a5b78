package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// oddWords is n made-up words: a prefix nobody else sends.
func oddWords(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	syl := []string{"zor", "qua", "vex", "mip", "tal", "dru", "kem", "sno", "ful", "rax", "yin", "bop"}
	var b strings.Builder
	for range n {
		for range 2 + r.IntN(2) {
			b.WriteString(syl[r.IntN(len(syl))])
		}
		b.WriteByte(' ')
	}
	return b.String()
}

func runCacheOracle(h *harness) (result, error) {
	st, err := h.startStack("cache-oracle", stackOpts{})
	if err != nil {
		return result{}, err
	}
	defer st.stop()
	const words = 600
	secret := oddWords(11, words)
	wrong := oddWords(12, words)
	url := st.base + "/v1/chat/completions"
	ask := func(prefix, question, tenant, user string) (string, answer) {
		body := chatBody(prefix+question, 4, false, user)
		a := send(nil, url, body, map[string]string{"X-Inferrail-Tenant": tenant}, 10*time.Second, false)
		v := "absent"
		if a.header != nil {
			if vs, ok := a.header["X-Inferrail-Predicted-Cached-Tokens"]; ok {
				v = strings.Join(vs, ",")
			}
		}
		if !a.ok() {
			v += " (" + a.outcome() + ")"
		}
		return v, a
	}
	aVal, _ := ask(secret, "what does this mean ", "tenant-a", "alice")
	time.Sleep(300 * time.Millisecond) // the index learns A's blocks when A's answer ends
	same, sameA := ask(secret, "what is the next line ", "tenant-b", "bob")
	miss, missA := ask(wrong, "what is the next line ", "tenant-b", "bob")
	ok := same == "absent" && miss == "absent"
	fig := fmt.Sprintf("B with A's prefix: %s; B with a wrong guess: %s (A itself: %s)", same, miss, aVal)
	d := []string{
		fmt.Sprintf("A (x-inferrail-tenant tenant-a, user alice) sends a %d-word made-up prefix and a question; B (tenant-b, user bob) sends the same prefix with another question, then a different made-up prefix of the same length.", words),
		fmt.Sprintf("x-inferrail-predicted-cached-tokens: A %s; B same prefix %s (replica %s); B wrong prefix %s (replica %s).",
			aVal, same, replicaOf(sameA), miss, replicaOf(missA)),
		"A difference between B's two values tells B whether someone else sent that prefix: the header is a cache oracle unless it is absent.",
	}
	return result{Figures: fig, Met: metWord(ok), Details: d}, nil
}

func replicaOf(a answer) string {
	if a.header == nil {
		return "none"
	}
	return a.header.Get("X-Inferrail-Replica")
}
