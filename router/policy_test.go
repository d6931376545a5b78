package router

import (
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func genCands(t *rapid.T) []Candidate {
	n := rapid.IntRange(1, 16).Draw(t, "n")
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{Replica: i, Load: Load{InFlight: rapid.IntRange(0, 6).Draw(t, "inflight")}}
	}
	return c
}

func TestEveryPolicyPicksACandidate(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				p, err := NewPolicy(name, Options{Seed: rapid.Uint64().Draw(rt, "seed")})
				if err != nil {
					rt.Fatal(err)
				}
				for range 5 {
					if _, err := Pick(p, &Request{}, genCands(rt)); err != nil {
						rt.Fatal(err)
					}
				}
			})
		})
	}
}

func TestLeastRequestPicksAMinimum(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _ := NewPolicy("least_request", Options{Seed: rapid.Uint64().Draw(t, "seed")})
		c := genCands(t)
		got := c[p.Pick(&Request{}, c)].Load.InFlight
		for _, x := range c {
			if x.Load.InFlight < got {
				t.Fatalf("picked %d in flight while a candidate has %d", got, x.Load.InFlight)
			}
		}
	})
}

func TestP2CNeverPicksAUniqueMaximum(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, _ := NewPolicy("p2c", Options{Seed: rapid.Uint64().Draw(t, "seed")})
		c := genCands(t)
		if len(c) < 2 {
			return
		}
		maxv, count := -1, 0
		for _, x := range c {
			if x.Load.InFlight > maxv {
				maxv, count = x.Load.InFlight, 1
			} else if x.Load.InFlight == maxv {
				count++
			}
		}
		if got := c[p.Pick(&Request{}, c)].Load.InFlight; count == 1 && got == maxv {
			t.Fatalf("picked the unique maximum %d", got)
		}
	})
}

func TestRoundRobinCycles(t *testing.T) {
	p, _ := NewPolicy("round_robin", Options{})
	c := make([]Candidate, 3)
	for i := range 9 {
		if got := p.Pick(&Request{}, c); got != i%3 {
			t.Fatalf("pick %d: got %d", i, got)
		}
	}
}

func TestRandomIsUniformAndSeeded(t *testing.T) {
	c := make([]Candidate, 4)
	draw := func(seed uint64) []int {
		p, _ := NewPolicy("random", Options{Seed: seed})
		counts := make([]int, 4)
		for range 40000 {
			counts[p.Pick(&Request{}, c)]++
		}
		return counts
	}
	a := draw(1)
	for i, n := range a {
		if n < 9500 || n > 10500 {
			t.Fatalf("candidate %d picked %d times of 40000", i, n)
		}
	}
	if b := draw(1); b[0] != a[0] || b[3] != a[3] {
		t.Fatal("same seed gave different choices")
	}
	if b := draw(2); b[0] == a[0] && b[1] == a[1] && b[2] == a[2] {
		t.Fatal("different seeds gave the same choices")
	}
}

func TestUnknownPolicy(t *testing.T) {
	_, err := NewPolicy("fastest", Options{})
	if err == nil || !strings.Contains(err.Error(), "round_robin") {
		t.Fatalf("error should list the allowed policies: %v", err)
	}
	p, _ := NewPolicy("random", Options{})
	if _, err := Pick(p, &Request{}, nil); err != ErrNoCandidates {
		t.Fatalf("empty candidates: %v", err)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, name := range Names() {
		for _, n := range []int{8, 64} {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				p, _ := NewPolicy(name, Options{Seed: 1})
				c := make([]Candidate, n)
				for i := range c {
					c[i].Load.InFlight = (i * 7) % 5
				}
				req := &Request{}
				b.ReportAllocs()
				for b.Loop() {
					p.Pick(req, c)
				}
			})
		}
	}
}

func TestFamilies(t *testing.T) {
	for name, want := range map[string]Family{"round_robin": Baseline, "p2c": Baseline, "cost_model": Ours, "kv_aware": Ours, "dynamo": Peer, "preble": Peer, "cost_model+kv": Ours} {
		if got, ok := FamilyOf(name); !ok || got != want {
			t.Errorf("%s: family %v (%v), want %v", name, got, ok, want)
		}
	}
	if _, ok := FamilyOf("nosuch"); ok || CacheBlind("nosuch") {
		t.Error("an unknown policy has a family")
	}
	if got := Ordered(); len(got) != len(Names()) || got[0] != "round_robin" || got[6] != "cost_model" {
		t.Errorf("ordered %v", got)
	}
}
