package workload

import (
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// checkSessions checks the closed-loop invariants of a simulated w2 run and
// returns the turns of each session.
func checkSessions(t tb, c *Config, res simResult) map[uint64][]*Request {
	t.Helper()
	bySession := map[uint64][]*Request{}
	var lastSession uint64
	for i, r := range res.reqs {
		checkRequest(t, c, r)
		if r.Session == 0 {
			t.Fatalf("request %d has no session", r.ID)
		}
		if r.Turn == 0 {
			if r.Session != lastSession+1 {
				t.Fatalf("session %d starts after session %d", r.Session, lastSession)
			}
			lastSession = r.Session
		}
		if i > 0 && r.Arrival < res.reqs[i-1].Arrival {
			t.Fatal("arrivals out of order")
		}
		turns := bySession[r.Session]
		if r.Turn != len(turns) {
			t.Fatalf("session %d: turn %d after %d turns", r.Session, r.Turn, len(turns))
		}
		if r.Turn == 0 {
			if len(r.Prompt) != 2 || r.Prompt[0].Len < c.W2.SystemMinTokens || r.Prompt[0].Len > c.W2.SystemMaxTokens {
				t.Fatalf("session %d: first prompt %+v", r.Session, r.Prompt)
			}
		} else {
			prev := turns[len(turns)-1]
			done, ok := res.finish[prev.ID]
			if !ok {
				t.Fatalf("session %d turn %d arrived before turn %d finished", r.Session, r.Turn, prev.Turn)
			}
			if res.failed[prev.ID] {
				t.Fatalf("session %d continued after failed turn %d", r.Session, prev.Turn)
			}
			if think := r.Arrival - done; think < c.W2.ThinkMin || think > c.W2.ThinkMax {
				t.Fatalf("session %d turn %d: think time %v", r.Session, r.Turn, think)
			}
			want := append(slices.Clone(prev.Prompt), prev.Output)
			if len(r.Prompt) != len(want)+1 || !slices.Equal(r.Prompt[:len(want)], want) {
				t.Fatalf("session %d turn %d does not resend the history", r.Session, r.Turn)
			}
			if u := r.Prompt[len(want)]; u.Len < c.W2.UserMinTokens || u.Len > c.W2.UserMaxTokens {
				t.Fatalf("user message of %d tokens", u.Len)
			}
		}
		bySession[r.Session] = append(turns, r)
	}
	return bySession
}

func TestW2ClosedLoop(t *testing.T) {
	c := mustConfig(t, "w2")
	c.Requests = 5000
	src := mustNew(t, c)
	res := simulate(t, src, serviceTime, nil)
	if len(res.reqs) != c.Requests {
		t.Fatalf("%d requests, want exactly %d", len(res.reqs), c.Requests)
	}
	sessions := checkSessions(t, &c, res)
	last := uint64(len(sessions))
	var total int
	for id, turns := range sessions {
		n := len(turns)
		total += n
		// Only the last session started may be cut short by the budget;
		// the defaults always fit max_model_len.
		if (n < c.W2.TurnsMin && id != last) || n > c.W2.TurnsMax {
			t.Fatalf("session %d has %d turns", id, n)
		}
	}
	if mean := float64(total) / float64(len(sessions)); mean < 5.5 || mean > 6.5 {
		t.Fatalf("mean %.2f turns per session, want about 6", mean)
	}
	if n := len(src.(*w2).sessions); n != 0 {
		t.Fatalf("%d sessions still remembered at the end", n)
	}
	ids := make([]uint64, len(res.reqs))
	for i, r := range res.reqs {
		ids[i] = r.ID
	}
	slices.Sort(ids)
	for i, id := range ids {
		if id != uint64(i+1) {
			t.Fatalf("request IDs are not 1..%d: %d at %d", len(ids), id, i)
		}
	}
}

func TestW2FailureEndsSession(t *testing.T) {
	c := mustConfig(t, "w2")
	c.Requests = 3000
	fail := func(r *Request) bool { return kvblock.Mix64(r.ID^0xfeed)%5 == 0 }
	res := simulate(t, mustNew(t, c), serviceTime, fail)
	sessions := checkSessions(t, &c, res)
	var failures int
	for _, turns := range sessions {
		for i, r := range turns {
			if res.failed[r.ID] {
				failures++
				if i != len(turns)-1 || res.followed[r.ID] != nil {
					t.Fatalf("session %d went on after failed turn %d", r.Session, r.Turn)
				}
			}
		}
	}
	if failures == 0 || len(res.reqs) > c.Requests {
		t.Fatalf("%d failures, %d requests", failures, len(res.reqs))
	}
}

func TestW2DoneIgnoresStaleRequests(t *testing.T) {
	c := mustConfig(t, "w2")
	c.Requests = 100
	c.W2.TurnsMin = 3
	src := mustNew(t, c)
	r0, _ := src.Next()
	r1, ok := src.Done(r0, r0.Arrival+time.Second, true)
	if !ok {
		t.Fatal("no second turn")
	}
	if r, ok := src.Done(r0, r0.Arrival+2*time.Second, true); ok {
		t.Fatalf("Done on a superseded turn returned request %d", r.ID)
	}
	if _, ok := src.Done(&Request{Session: 999}, time.Hour, true); ok {
		t.Fatal("Done on an unknown session returned a request")
	}
	if _, ok := src.Done(r1, r1.Arrival+time.Second, true); !ok {
		t.Fatal("no third turn")
	}
}

func TestW2ContextLimitEndsSession(t *testing.T) {
	c := mustConfig(t, "w2")
	c.Requests = 3000
	c.MaxModelLen = 4096
	c.W2.TurnsMin, c.W2.TurnsMax = 20, 20
	res := simulate(t, mustNew(t, c), serviceTime, nil)
	sessions := checkSessions(t, &c, res) // checks prompt + max_tokens <= max_model_len
	for id, turns := range sessions {
		if len(turns) >= 20 {
			t.Fatalf("session %d ran all %d turns in 4096 tokens", id, len(turns))
		}
	}
}

func TestW2Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c, _ := DefaultConfig("w2")
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
		genOutput(t, &c)
		p := &c.W2
		p.SystemPrompts = rapid.IntRange(1, 8).Draw(t, "system_prompts")
		p.SystemMinTokens = rapid.IntRange(1, 2000).Draw(t, "system_min")
		p.SystemMaxTokens = rapid.IntRange(p.SystemMinTokens, 2000).Draw(t, "system_max")
		p.TurnsMin = rapid.IntRange(1, 12).Draw(t, "turns_min")
		p.TurnsMax = rapid.IntRange(p.TurnsMin, 12).Draw(t, "turns_max")
		p.UserMedianTokens = rapid.Float64Range(1, 500).Draw(t, "user_median")
		p.UserMinTokens = rapid.IntRange(1, 300).Draw(t, "user_min")
		p.UserMaxTokens = rapid.IntRange(p.UserMinTokens, 600).Draw(t, "user_max")
		p.ThinkMin = time.Duration(rapid.Int64Range(1, int64(time.Minute)).Draw(t, "think_min"))
		p.ThinkMax = p.ThinkMin + time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "think_span"))
		c.MaxModelLen = p.SystemMaxTokens + p.UserMaxTokens + c.Output.MaxTokens + rapid.IntRange(0, 8000).Draw(t, "slack")
		failEvery := rapid.Uint64Range(0, 10).Draw(t, "fail_every")
		fail := func(r *Request) bool { return failEvery > 0 && kvblock.Mix64(r.ID^c.Seed)%failEvery == 0 }
		res := simulate(t, mustNew(t, c), serviceTime, fail)
		checkSessions(t, &c, res)
		if len(res.reqs) > c.Requests {
			t.Fatalf("%d requests, limit %d", len(res.reqs), c.Requests)
		}
	})
}

// TestW2HistoryNotAliased checks that a caller scribbling on a handed-out
// prompt cannot change later turns.
func TestW2HistoryNotAliased(t *testing.T) {
	c := mustConfig(t, "w2")
	c.W2.TurnsMin = 4
	src := mustNew(t, c)
	r0, _ := src.Next()
	want := slices.Clone(r0.Prompt)
	r0.Prompt[0] = kvblock.Segment{ID: 1, Len: 1}
	r1, _ := src.Done(r0, r0.Arrival, true)
	if !slices.Equal(r1.Prompt[:2], want) {
		t.Fatal("turn 1 saw the caller's change to turn 0's prompt")
	}
}
