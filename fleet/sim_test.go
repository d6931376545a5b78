package fleet

import (
	"bytes"
	"encoding/json"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

func smallConfig(t testing.TB, wl string, n int) Config {
	t.Helper()
	c := DefaultConfig()
	w, err := workloadDefault(wl)
	if err != nil {
		t.Fatal(err)
	}
	c.Workload = w
	c.Workload.Requests = n
	c.Workload.Rate = DefaultRate(wl, c.Replicas)
	return c
}

func summaryJSON(t *testing.T, s results.Summary) []byte {
	t.Helper()
	s.SimWallS = 0 // the only field that measures the host, not the simulation
	var b bytes.Buffer
	if err := results.WriteJSON(&b, s); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestEveryRequestCompletes(t *testing.T) {
	if raceEnabled {
		t.Skip("simulations on one goroutine: the run without the race detector checks them")
	}
	for _, wl := range []string{"w1", "w2", "w6"} {
		for _, pol := range router.Names() {
			c := smallConfig(t, wl, 300)
			c.Policy = pol
			out, err := Simulate(c)
			if err != nil {
				t.Fatalf("%s/%s: %v", wl, pol, err)
			}
			s := out.Summary
			if s.Completed != 300 || s.Failed != 0 || len(out.Records) != 300 {
				t.Fatalf("%s/%s: completed %d failed %d records %d", wl, pol, s.Completed, s.Failed, len(out.Records))
			}
			for _, r := range out.Records {
				if !r.HasFirstToken || r.FirstToken < r.Arrival || r.End < r.FirstToken || r.Replica < 0 {
					t.Fatalf("%s/%s: inconsistent record %+v", wl, pol, r)
				}
			}
			for i, m := range out.Engines {
				if m.Running != 0 || m.Waiting != 0 || m.UsedBlocks != 0 {
					t.Fatalf("%s/%s: replica %d not drained: %+v", wl, pol, i, m)
				}
			}
		}
	}
}

func TestSameSeedSameSummary(t *testing.T) {
	for _, wl := range []string{"w1", "w2", "w6"} {
		c := smallConfig(t, wl, 400)
		c.Policy = "p2c"
		c.Seed = 7
		a, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Simulate(c)
		if ja, jb := summaryJSON(t, a.Summary), summaryJSON(t, b.Summary); !bytes.Equal(ja, jb) {
			t.Fatalf("%s: same seed, different summaries:\n%s\n%s", wl, ja, jb)
		}
		if !reflect.DeepEqual(a.Records, b.Records) {
			t.Fatalf("%s: same seed, different records", wl)
		}
		c.Seed = 8
		d, _ := Simulate(c)
		if bytes.Equal(summaryJSON(t, a.Summary), summaryJSON(t, d.Summary)) {
			t.Fatalf("%s: different seeds gave identical summaries", wl)
		}
	}
}

// TestTwoCoresSameBytes: the index's bookkeeping on a second core changes
// nothing a run reports, whatever the policy, index mode, queueing and
// arrival process.
func TestTwoCoresSameBytes(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("TwoCores needs GOMAXPROCS > 1")
	}
	cases := []struct {
		wl, policy string
		set        func(*Config)
		short      bool // also in the race detector's run (-short), shorter
	}{
		{"w1", "cost_model", nil, false},
		{"w1", "llmd", nil, false},
		// Requests that end before the next arrival (the index's jobs for
		// them queue behind each other).
		{"w1", "cost_model", func(c *Config) { c.Replicas = 3; c.Workload.Rate = c.DefaultRate() }, true},
		{"w2", "dynamo", func(c *Config) { c.Index = IndexEvents }, true},
		{"w6", "cost_model", func(c *Config) {
			c.Admission = gateway.AdmitKV
			c.QueueMaxRequests = 64
			c.Workload.Rate *= 1.5
		}, false},
		{"w2", "preble", func(c *Config) { c.Engine.NumGPUBlocks = 600 }, false},
		{"w3", "cost_model", nil, false}, // sessions whose next turn follows an answer
	}
	n := 1500
	if testing.Short() {
		n = 400
	}
	for _, tc := range cases {
		if testing.Short() && !tc.short {
			continue
		}
		c := smallConfig(t, tc.wl, n)
		c.Policy = tc.policy
		if tc.set != nil {
			tc.set(&c)
		}
		sameOnTwoCores(t, tc.wl+"/"+tc.policy, c)
	}
}

// TestTwoCoresSameBytesReplay: the same on a trace's first 1,500 requests,
// whose prompts are long chains of shared segments.
func TestTwoCoresSameBytesReplay(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("TwoCores needs GOMAXPROCS > 1")
	}
	limit := 1500
	if testing.Short() {
		limit = 300
	}
	c := replayConfig(t, mooncake, "cost_model", 8, limit)
	sameOnTwoCores(t, "mooncake", c)
}

// sameOnTwoCores runs c on one core, then twice at once on two (so that the
// goroutines also take turns on the cores), and compares.
func sameOnTwoCores(t *testing.T, name string, c Config) {
	t.Helper()
	{
		one, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		c.TwoCores = true
		var outs [2]*Output
		var errs [2]error
		var wg sync.WaitGroup
		for k := range outs {
			wg.Go(func() { outs[k], errs[k] = Simulate(c) })
		}
		wg.Wait()
		for k, two := range outs {
			if errs[k] != nil {
				t.Fatal(errs[k])
			}
			if a, b := summaryJSON(t, one.Summary), summaryJSON(t, two.Summary); !bytes.Equal(a, b) {
				t.Fatalf("%s: summaries differ on two cores:\n%s\n%s", name, a, b)
			}
			if !reflect.DeepEqual(one.Records, two.Records) || !reflect.DeepEqual(one.Engines, two.Engines) {
				t.Fatalf("%s: records or engine counters differ on two cores", name)
			}
		}
	}
}

func TestSummaryHasContractFields(t *testing.T) {
	out, err := Simulate(smallConfig(t, "w1", 100))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(summaryJSON(t, out.Summary), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workload", "policy", "replicas", "requests", "completed", "failed", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "hit_rate", "predicted_hit_rate", "slo_attainment", "goodput_rps", "per_replica", "sim_wall_s", "sim_events"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary lacks %q", k)
		}
	}
	for _, k := range []string{"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"} {
		lat := m[k].(map[string]any)
		for _, q := range []string{"mean", "p50", "p90", "p99"} {
			if v, ok := lat[q].(float64); !ok || v <= 0 {
				t.Errorf("%s.%s = %v", k, q, lat[q])
			}
		}
	}
}

func TestW2TurnsWaitForThePreviousTurn(t *testing.T) {
	c := smallConfig(t, "w2", 600)
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	type turn struct{ arrival, end time.Duration }
	sessions := map[uint64]map[int]turn{}
	for _, r := range out.Records {
		if sessions[r.Session] == nil {
			sessions[r.Session] = map[int]turn{}
		}
		sessions[r.Session][r.Turn] = turn{r.Arrival, r.End}
	}
	followUps := 0
	for id, turns := range sessions {
		for k, tn := range turns {
			if k == 0 {
				continue
			}
			prev, ok := turns[k-1]
			if !ok {
				t.Fatalf("session %d: turn %d without turn %d", id, k, k-1)
			}
			gap := tn.arrival - prev.end
			if gap < 10*time.Second || gap > 20*time.Second {
				t.Fatalf("session %d turn %d arrived %v after turn %d ended (think time is 10-20s)", id, k, gap, k-1)
			}
			followUps++
		}
	}
	if followUps < 300 {
		t.Fatalf("only %d follow-up turns", followUps)
	}
	// Multi-turn reuse: later turns find their history cached somewhere.
	if out.Summary.HitRate <= 0 {
		t.Fatal("no prefix reuse at all in multi-turn chat")
	}
}

// spy records what a policy is shown.
type spy struct {
	router.Policy
	maxAge   time.Duration
	sawValid bool
	calls    int
	badLoad  bool
}

func (s *spy) Pick(req *router.Request, cands []router.Candidate) int {
	s.calls++
	for _, c := range cands {
		if c.Load.Engine.Valid {
			s.sawValid = true
			s.maxAge = max(s.maxAge, c.Load.Engine.Age)
		}
		if c.Load.InFlight < 0 || c.Load.Pending < 0 || c.Load.Pending > c.Load.InFlight {
			s.badLoad = true
		}
	}
	return s.Policy.Pick(req, cands)
}

func TestRouterSeesScrapedLoadNoOlderThanTheInterval(t *testing.T) {
	c := smallConfig(t, "w6", 500)
	c.ScrapeInterval = 250 * time.Millisecond
	s, err := newSim(c)
	if err != nil {
		t.Fatal(err)
	}
	rt := s.gws[0].core.Router()
	sp := &spy{Policy: rt.Policy()}
	rt.SetPolicy(sp)
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	if sp.calls != 500 || !sp.sawValid {
		t.Fatalf("policy called %d times, saw engine load: %v", sp.calls, sp.sawValid)
	}
	if sp.maxAge > c.ScrapeInterval || sp.maxAge < c.ScrapeInterval/2 {
		t.Fatalf("oldest engine load seen %v; scrapes every %v", sp.maxAge, c.ScrapeInterval)
	}
	if sp.badLoad {
		t.Fatal("gateway counters went inconsistent")
	}
}

func TestBadConfig(t *testing.T) {
	c := DefaultConfig()
	c.Replicas = 0
	c.Policy = "nope"
	c.ScrapeInterval = 0
	c.Workload.Rate = -1
	_, err := Simulate(c)
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"replicas", "policy", "scrape-interval", "rate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestRequestTooLongFails(t *testing.T) {
	c := smallConfig(t, "w6", 50)
	c.Engine.MaxModelLen = 2048 // the workload allows longer prompts than this engine
	c.Workload.W6.InputMedianTokens = 1500
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if out.Summary.Failed == 0 || out.Summary.Completed+out.Summary.Failed != 50 {
		t.Fatalf("completed %d failed %d", out.Summary.Completed, out.Summary.Failed)
	}
	// The gateway refuses them before routing, as too long, not the engine.
	if out.Summary.Rejected["too_long"] != out.Summary.Failed || out.Summary.EngineFailed != 0 {
		t.Fatalf("rejected %v, engine failed %d, failed %d", out.Summary.Rejected, out.Summary.EngineFailed, out.Summary.Failed)
	}
}

// The gateways read the engines' length as live does by default (refusing
// longer requests, weighing nothing by it); a configured max_model_len is
// live's configured one, and names the limit in the reasons.
func TestGatewayMaxModelLen(t *testing.T) {
	c := DefaultConfig()
	c.Engine.MaxModelLen = 4096
	g := c.gatewayConfig(nil)
	if g.MaxModelLen != 0 || g.ContextLen != 4096 {
		t.Fatalf("default: max_model_len %d, context %d; want 0 and 4096", g.MaxModelLen, g.ContextLen)
	}
	c.MaxModelLen = 2048
	g = c.gatewayConfig(nil)
	if g.MaxModelLen != 2048 || g.ContextLen != 4096 {
		t.Fatalf("configured: max_model_len %d, context %d; want 2048 and 4096", g.MaxModelLen, g.ContextLen)
	}
	if r := c.FailureReasons()[results.RejectTooLong]; !strings.Contains(r, "max_model_len 2048") {
		t.Fatalf("too_long reason %q", r)
	}
	c.MaxModelLen = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "max_model_len") {
		t.Fatalf("a negative max_model_len: %v", err)
	}
}
