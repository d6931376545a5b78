package remote

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// fakeResolver answers from a table a test changes; a host mapped to nil
// blocks until the lookup's context ends.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]string
	errs    map[string]error
	calls   int
}

func (r *fakeResolver) set(host string, addrs []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers[host], r.errs[host] = addrs, err
}

func (r *fakeResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	r.mu.Lock()
	r.calls++
	addrs, err := r.answers[host], r.errs[host]
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if addrs == nil {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return addrs, nil
}

// changes records onChange calls.
type changes struct {
	mu  sync.Mutex
	got []change
}

type change struct {
	group string
	at    time.Time
	eps   []Endpoint
}

func (c *changes) add(group string, eps []Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, change{group, time.Now(), eps})
}

func (c *changes) all() []change {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func names(eps []Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

func TestDiscoveryRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := &fakeResolver{answers: map[string][]string{}, errs: map[string]error{}}
		res.set("vllm.svc", []string{"10.0.0.7", "10.0.0.5", "10.0.0.7"}, nil)
		res.set("sgl.svc", []string{"2001:db8::1"}, nil)
		var ch changes
		var failures []string
		d, err := NewDiscovery(DiscoveryConfig{
			Resolver: res,
			Groups: []Group{
				{Name: "vllm", Host: "vllm.svc", Port: 8000},
				{Name: "sgl", Host: "sgl.svc", Port: 30000, Scheme: "https", Path: "/v1"},
			},
			OnError: func(group string, err error) { failures = append(failures, group) },
		}, ch.add)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		stop := runInBackground(d.Run)
		defer stop()
		synctest.Wait()

		// Both groups at start, sorted and deduplicated, IPv6 bracketed.
		got := ch.all()
		if len(got) != 2 || !got[0].at.Equal(start) {
			t.Fatalf("changes at start: %+v", got)
		}
		if want := []Endpoint{
			{Name: "vllm-10.0.0.5:8000", URL: "http://10.0.0.5:8000", Addr: "10.0.0.5:8000"},
			{Name: "vllm-10.0.0.7:8000", URL: "http://10.0.0.7:8000", Addr: "10.0.0.7:8000"},
		}; got[0].group != "vllm" || !slices.Equal(got[0].eps, want) {
			t.Errorf("vllm endpoints %+v, want %+v", got[0].eps, want)
		}
		if want := []Endpoint{{Name: "sgl-[2001:db8::1]:30000", URL: "https://[2001:db8::1]:30000/v1", Addr: "[2001:db8::1]:30000"}}; got[1].group != "sgl" || !slices.Equal(got[1].eps, want) {
			t.Errorf("sgl endpoints %+v, want %+v", got[1].eps, want)
		}

		// From here on the test acts half way between lookups (at 5s,
		// 15s, ...; lookups at 0, 10s, ...), so that no two happen at once.
		time.Sleep(DefaultRefresh / 2)

		// The same set in another order: no change.
		res.set("vllm.svc", []string{"10.0.0.5", "10.0.0.7"}, nil)
		time.Sleep(DefaultRefresh)
		if n := len(ch.all()); n != 2 {
			t.Errorf("%d changes after an unchanged refresh", n)
		}

		// A failing lookup keeps the last set, counted and reported.
		res.set("vllm.svc", nil, errors.New("server misbehaving"))
		time.Sleep(DefaultRefresh)
		if n := len(ch.all()); n != 2 {
			t.Errorf("a failed lookup changed the set")
		}
		if eps, ok := d.Endpoints("vllm"); !ok || len(eps) != 2 {
			t.Errorf("after a failed lookup: %v, %v", eps, ok)
		}
		// A lookup that hangs fails at Timeout.
		res.set("vllm.svc", nil, nil)
		time.Sleep(DefaultRefresh)
		if st := d.Stats(); st.Failures != 2 || st.Lookups != 8 || st.Changes != 2 || !slices.Equal(failures, []string{"vllm", "vllm"}) {
			t.Errorf("stats %+v, failures %v", st, failures)
		}

		// Scale up and down: one change each, at the refresh.
		res.set("vllm.svc", []string{"10.0.0.5", "10.0.0.7", "10.0.0.9"}, nil)
		time.Sleep(DefaultRefresh)
		res.set("vllm.svc", []string{"10.0.0.9"}, nil)
		time.Sleep(DefaultRefresh)
		got = ch.all()[2:]
		if len(got) != 2 ||
			!slices.Equal(names(got[0].eps), []string{"vllm-10.0.0.5:8000", "vllm-10.0.0.7:8000", "vllm-10.0.0.9:8000"}) ||
			!slices.Equal(names(got[1].eps), []string{"vllm-10.0.0.9:8000"}) {
			t.Errorf("scale up and down: %+v", got)
		}
		if !got[0].at.Equal(start.Add(4 * DefaultRefresh)) {
			t.Errorf("change at %v, want at the 4th refresh", got[0].at.Sub(start))
		}

		// An empty answer empties the group.
		res.set("vllm.svc", []string{}, nil)
		time.Sleep(DefaultRefresh)
		if got := ch.all(); len(got) != 5 || len(got[4].eps) != 0 {
			t.Errorf("empty answer: %+v", got[len(got)-1])
		}
	})
}

func TestDiscoveryConfig(t *testing.T) {
	noop := func(string, []Endpoint) {}
	for _, cfg := range []DiscoveryConfig{
		{},
		{Groups: []Group{{Name: "a", Host: "h", Port: 0}}},
		{Groups: []Group{{Name: "a", Host: "", Port: 80}}},
		{Groups: []Group{{Name: "", Host: "h", Port: 80}}},
		{Groups: []Group{{Name: "a", Host: "h", Port: 80}, {Name: "a", Host: "g", Port: 80}}},
		{Groups: []Group{{Name: "a", Host: "h", Port: 80, Scheme: "grpc"}}},
		{Groups: []Group{{Name: "a", Host: "h", Port: 80, Path: "v1"}}},
		{Groups: []Group{{Name: "a", Host: "h", Port: 80}}, Refresh: -1},
	} {
		if _, err := NewDiscovery(cfg, noop); err == nil {
			t.Errorf("NewDiscovery(%+v) succeeded", cfg)
		}
	}
	if _, err := NewDiscovery(DiscoveryConfig{Groups: []Group{{Name: "a", Host: "h", Port: 80}}}, nil); err == nil {
		t.Error("NewDiscovery accepted a nil onChange")
	}
}

func TestGroupEndpoints(t *testing.T) {
	g := Group{Name: "g", Port: 8000, Scheme: "http"}
	eps, err := GroupEndpoints(g, []string{"::ffff:10.0.0.1", "10.0.0.1", "fe80::1%eth0", "not-an-ip"})
	if err == nil {
		t.Error("no error for a non-IP answer")
	}
	want := []Endpoint{
		{Name: "g-10.0.0.1:8000", URL: "http://10.0.0.1:8000", Addr: "10.0.0.1:8000"},
		{Name: "g-[fe80::1%eth0]:8000", URL: "http://[fe80::1%25eth0]:8000", Addr: "[fe80::1%eth0]:8000"},
	}
	if !slices.Equal(eps, want) {
		t.Errorf("got  %+v\nwant %+v", eps, want)
	}
}

// TestGroupEndpointsProperty: the endpoints of any answer are sorted,
// unique, and do not depend on the answer's order or repeats.
func TestGroupEndpointsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.OneOf(
			rapid.Custom(func(t *rapid.T) string {
				return "10.0." + itoa(rapid.IntRange(0, 3).Draw(t, "c")) + "." + itoa(rapid.IntRange(0, 9).Draw(t, "d"))
			}),
			rapid.Custom(func(t *rapid.T) string { return "2001:db8::" + itoa(rapid.IntRange(1, 9).Draw(t, "h")) }),
		)
		addrs := rapid.SliceOf(gen).Draw(t, "addrs")
		g := Group{Name: "g", Port: rapid.IntRange(1, 65535).Draw(t, "port")}
		eps, err := GroupEndpoints(g, addrs)
		if err != nil {
			t.Fatal(err)
		}
		shuffled := rapid.Permutation(append(slices.Clone(addrs), addrs...)).Draw(t, "shuffled")
		again, _ := GroupEndpoints(g, shuffled)
		if !slices.Equal(eps, again) {
			t.Fatalf("order or repeats changed the endpoints: %v vs %v", eps, again)
		}
		for i := 1; i < len(eps); i++ {
			if eps[i].Name == eps[i-1].Name {
				t.Fatalf("duplicate %v", eps[i])
			}
		}
		uniq := map[string]bool{}
		for _, a := range addrs {
			uniq[a] = true
		}
		if len(eps) != len(uniq) {
			t.Fatalf("%d endpoints for %d distinct addresses", len(eps), len(uniq))
		}
	})
}

func itoa(i int) string { return string(rune('0' + i)) }
