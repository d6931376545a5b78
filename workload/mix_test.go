package workload

import (
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// class is a request's tenant and priority.
type class struct {
	tenant   string
	priority int
}

func classOf(r *Request) class { return class{r.Tenant, r.Priority} }

// mixedStream is stream with c.Mix = mix.
func mixedStream(t *testing.T, name string, mix []MixClass, requests int) []*Request {
	c := mustConfig(t, name)
	c.Requests = requests
	c.Mix = mix
	return simulate(t, mustNew(t, c), serviceTime, nil).reqs
}

// TestMixAbsent: without a mix every request of every workload has tenant
// "" and priority 0.
func TestMixAbsent(t *testing.T) {
	for _, name := range Names() {
		for _, r := range stream(t, name, 1, 2000) {
			if r.Tenant != "" || r.Priority != 0 {
				t.Fatalf("%s: request %d has tenant %q priority %d without a mix", name, r.ID, r.Tenant, r.Priority)
			}
		}
	}
}

// TestMixLeavesStreamsAlone: with the same seed, a mix changes only the
// tenants and priorities, never a prompt, output, arrival or session.
func TestMixLeavesStreamsAlone(t *testing.T) {
	mix := []MixClass{{Tenant: "a", Share: 0.5}, {Tenant: "b", Priority: 3, Share: 0.25}, {Priority: 7, Share: 0.25}}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			plain := mixedStream(t, name, nil, 2000)
			mixed := mixedStream(t, name, mix, 2000)
			seen := map[class]int{}
			for _, r := range mixed {
				seen[classOf(r)]++
				r.Tenant, r.Priority = "", 0
			}
			if !reflect.DeepEqual(plain, mixed) {
				t.Fatal("the mix changed the requests")
			}
			if len(seen) != len(mix) {
				t.Fatalf("classes seen: %v", seen)
			}
		})
	}
}

// TestMixShares measures the class shares over 40k requests; the shares
// are normalised, so 7:2:1 is 0.7:0.2:0.1, draw for draw.
func TestMixShares(t *testing.T) {
	mix := []MixClass{{Tenant: "a", Share: 7}, {Tenant: "b", Priority: 1, Share: 2}, {Tenant: "c", Priority: 1000, Share: 1}}
	const n = 40000
	reqs := mixedStream(t, "w6", mix, n)
	counts := map[class]int{}
	for _, r := range reqs {
		counts[classOf(r)]++
	}
	for _, m := range mix {
		p := m.Share / 10
		got := float64(counts[class{m.Tenant, m.Priority}]) / n
		// 5 standard errors.
		if tol := 5 * math.Sqrt(p*(1-p)/n); math.Abs(got-p) > tol {
			t.Fatalf("class %q: share %.4f, want %.4f ± %.4f", m.Tenant, got, p, tol)
		}
	}
	norm := []MixClass{{Tenant: "a", Share: 0.7}, {Tenant: "b", Priority: 1, Share: 0.2}, {Tenant: "c", Priority: 1000, Share: 0.1}}
	for i, r := range mixedStream(t, "w6", norm, n) {
		if classOf(r) != classOf(reqs[i]) {
			t.Fatalf("request %d: class %v with shares 0.7:0.2:0.1, %v with 7:2:1", r.ID, classOf(r), classOf(reqs[i]))
		}
	}
	// One class: every request has it.
	for _, r := range mixedStream(t, "w1", []MixClass{{Tenant: "only", Priority: 2, Share: 0.01}}, 500) {
		if r.Tenant != "only" || r.Priority != 2 {
			t.Fatalf("request %d: %v", r.ID, classOf(r))
		}
	}
}

// TestMixSessions: every turn of a w2 session and every step of a w3 task
// has its session's class, and the sessions' classes follow the shares.
func TestMixSessions(t *testing.T) {
	mix := []MixClass{{Tenant: "x", Share: 0.8}, {Tenant: "y", Priority: 9, Share: 0.2}}
	for _, name := range []string{"w2", "w3"} {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Requests = 0
			c.Duration = 3600e9 // an hour: thousands of sessions
			c.Mix = mix
			reqs := simulate(t, mustNew(t, c), serviceTime, nil).reqs
			bySession := map[uint64]class{}
			multi := 0
			for _, r := range reqs {
				if r.Session == 0 {
					t.Fatalf("request %d has no session", r.ID)
				}
				if r.Turn == 0 {
					bySession[r.Session] = classOf(r)
					continue
				}
				multi++
				if got, want := classOf(r), bySession[r.Session]; got != want {
					t.Fatalf("session %d turn %d: class %v, first turn %v", r.Session, r.Turn, got, want)
				}
			}
			if multi < len(reqs)/2 {
				t.Fatalf("only %d of %d requests are later turns", multi, len(reqs))
			}
			ny := 0
			for _, k := range bySession {
				if k == (class{"y", 9}) {
					ny++
				} else if k != (class{"x", 0}) {
					t.Fatalf("unknown class %v", k)
				}
			}
			n := float64(len(bySession))
			if got := float64(ny) / n; math.Abs(got-0.2) > 5*math.Sqrt(0.2*0.8/n) {
				t.Fatalf("%d sessions, share of y %.3f, want 0.2", len(bySession), got)
			}
		})
	}
}

// genMix draws a valid mix.
func genMix(t *rapid.T) []MixClass {
	n := rapid.IntRange(1, 8).Draw(t, "classes")
	mix := make([]MixClass, 0, n)
	seen := map[class]bool{}
	for len(mix) < n {
		m := MixClass{
			Tenant:   rapid.StringMatching(`[a-z0-9:_-]{0,12}`).Draw(t, "tenant"),
			Priority: rapid.IntRange(0, MaxPriority).Draw(t, "priority"),
			Share:    rapid.Float64Range(1e-3, 1e3).Draw(t, "share"),
		}
		if k := (class{m.Tenant, m.Priority}); !seen[k] {
			seen[k] = true
			mix = append(mix, m)
		}
	}
	return mix
}

// TestMixProperty: for any workload, seed and mix, every request's class is
// one of the mix's, and a closed-loop session keeps one class.
func TestMixProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name := rapid.SampledFrom(Names()).Draw(t, "workload")
		c := mustConfig(t, name)
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
		c.Mix = genMix(t)
		ok := map[class]bool{}
		for _, m := range c.Mix {
			ok[class{m.Tenant, m.Priority}] = true
		}
		sessions := map[uint64]class{}
		for _, r := range simulate(t, mustNew(t, c), serviceTime, nil).reqs {
			k := classOf(r)
			if !ok[k] {
				t.Fatalf("request %d: class %v not in the mix %+v", r.ID, k, c.Mix)
			}
			if r.Session == 0 {
				continue
			}
			if first, seen := sessions[r.Session]; seen && first != k {
				t.Fatalf("session %d: class %v, then %v", r.Session, first, k)
			}
			sessions[r.Session] = k
		}
	})
}

func TestParseMix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []MixClass
	}{
		{"", nil},
		{"  ", nil},
		{"a:0:0.7,b:1:0.3", []MixClass{{"a", 0, 0.7}, {"b", 1, 0.3}}},
		{" a : 0 : 0.7 , b:1:3 ", []MixClass{{"a", 0, 0.7}, {"b", 1, 3}}},
		{":5:1", []MixClass{{"", 5, 1}}},
		{"org:team:1000:1e-3", []MixClass{{"org:team", 1000, 1e-3}}},
		{"a:0:1,a:1:1", []MixClass{{"a", 0, 1}, {"a", 1, 1}}},
	} {
		got, err := ParseMix(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("ParseMix(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"a:0:0.7,", `mix item 2 (""): empty`},
		{"a:0:0.7,,b:0:1", `mix item 2 (""): empty`},
		{"a", `mix item 1 ("a"): want tenant:priority:share`},
		{"a:0.5", `mix item 1 ("a:0.5"): want tenant:priority:share, got two fields`},
		{"a:0:1,b:x:0.3", `mix item 2 ("b:x:0.3"): priority: "x" is not an integer`},
		{"a:1.5:1", `priority: "1.5" is not an integer`},
		{"a:0:much", `mix item 1 ("a:0:much"): share: "much" is not a number`},
		{"a:0:", `share: "" is not a number`},
		{"a:0:0.5,b:1:-1", `mix item 2 ("b:1:-1"): share: must be positive, got -1`},
		{"a:0:0", `share: must be positive, got 0`},
		{"a:0:1e-400", `share: must be positive, got 0`},
		{"a:0:1e400", `share: must be finite, got +Inf`},
		{"a:0:NaN", `share: must be positive, got NaN`},
		{"a:0:inf", `share: must be finite, got +Inf`},
		{"a:1001:1", `mix item 1 ("a:1001:1"): priority: must be in [0, 1000], got 1001`},
		{"a:-1:1", `priority: must be in [0, 1000], got -1`},
		{"a:0:1,b:0:1,a:0:2", `mix item 3 ("a:0:2"): duplicates item 1 (tenant "a", priority 0)`},
		{strings.Repeat("t", 129) + ":0:1", `tenant: must be at most 128 bytes, got 129`},
		{"\xff:0:1", `tenant: must be valid UTF-8`},
		{strings.Repeat("a:0:1,", 64) + "a:0:1", `mix: at most 64 classes, got 65`},
	} {
		got, err := ParseMix(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("ParseMix(%q) = %+v, %v; want an error containing %q", tc.in, got, err, tc.want)
		}
	}
	// 64 classes is the limit, not over it.
	var items []string
	for i := range MaxMixClasses {
		items = append(items, "t"+strconv.Itoa(i)+":0:1")
	}
	if got, err := ParseMix(strings.Join(items, ",")); err != nil || len(got) != MaxMixClasses {
		t.Fatalf("64 classes: %d, %v", len(got), err)
	}
}

// formatMix is the inverse of ParseMix.
func formatMix(mix []MixClass) string {
	items := make([]string, len(mix))
	for i, m := range mix {
		items[i] = m.Tenant + ":" + strconv.Itoa(m.Priority) + ":" + strconv.FormatFloat(m.Share, 'g', -1, 64)
	}
	return strings.Join(items, ",")
}

// FuzzParseMix: any flag value is an error or a mix that Validate accepts,
// that a source can be built with, and that formats back to itself; never a
// panic.
func FuzzParseMix(f *testing.F) {
	for _, s := range []string{"", "a:0:0.7,b:1:0.3", ":5:1", "org:team:1000:1e-3", "a:0:1,a:0:1", "a:x:1", "a:0:inf", ",", "a::", "::", " a : 1 : 2 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mix, err := ParseMix(s)
		if err != nil {
			if mix != nil {
				t.Fatalf("ParseMix(%q) failed with a mix: %+v", s, mix)
			}
			return
		}
		c, _ := DefaultConfig("w6")
		c.Requests = 20
		c.Mix = mix
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseMix(%q) = %+v, rejected by Validate: %v", s, mix, err)
		}
		src, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range drainOpen(src) {
			found := len(mix) == 0 && r.Tenant == "" && r.Priority == 0
			for _, m := range mix {
				found = found || (m.Tenant == r.Tenant && m.Priority == r.Priority)
			}
			if !found {
				t.Fatalf("request %d: class %q/%d not in %+v", r.ID, r.Tenant, r.Priority, mix)
			}
		}
		again, err := ParseMix(formatMix(mix))
		if err != nil || !reflect.DeepEqual(again, mix) {
			t.Fatalf("round trip of %+v: %+v, %v", mix, again, err)
		}
	})
}
