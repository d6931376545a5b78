package fleet

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/router/gateway"
)

// A shadow that is the real policy agrees on every decision of a run, and a
// shadow, whichever, changes nothing the run measures.
func TestShadowInTheSimulator(t *testing.T) {
	for _, pol := range []string{"round_robin", "random", "p2c", "prefix_hash", "cost_model", "llmd", "aibrix"} {
		c := smallConfig(t, "w2", 300)
		c.Policy = pol
		c.Gateways = 2
		c.Admission = gateway.AdmitKV
		plain, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		c.ShadowPolicy = pol
		self, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		var decisions uint64
		for g, st := range self.Shadow {
			if st.Agreement() != 1 || st.Primary != pol || st.Shadow != pol {
				t.Fatalf("%s: gateway %d's shadow of itself: %+v", pol, g, st)
			}
			if st.Measured[0].Count != 0 || st.Measured[1].Count != st.Decisions {
				t.Fatalf("%s: gateway %d measured %d and %d of %d decisions", pol, g, st.Measured[0].Count, st.Measured[1].Count, st.Decisions)
			}
			decisions += st.Decisions
		}
		if len(self.Shadow) != 2 || decisions < 300 {
			t.Fatalf("%s: %d gateways' tallies, %d decisions for 300 requests", pol, len(self.Shadow), decisions)
		}
		c.ShadowPolicy = "least_request"
		other, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		want := summaryJSON(t, plain.Summary)
		for _, out := range []*Output{self, other} {
			if got := summaryJSON(t, out.Summary); !bytes.Equal(got, want) {
				t.Fatalf("%s: a shadow changed the run:\n%s\nwithout:\n%s", pol, got, want)
			}
		}
	}
}

// A cache-blind shadow of cost_model disagrees on a shared-prefix workload,
// and cost_model's estimates of its picks are higher.
func TestShadowDisagreement(t *testing.T) {
	c := smallConfig(t, "w1", 400)
	c.Policy = "cost_model"
	c.ShadowPolicy = "round_robin"
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	st := out.Shadow[0]
	if a := st.Agreement(); !(a > 0 && a < 0.9) {
		t.Fatalf("agreement %v", a)
	}
	if !(st.EstimatedShadow.Sum > st.EstimatedPrimary.Sum) {
		t.Fatalf("round robin's picks estimated %v s, cost_model's %v s", st.EstimatedShadow.Sum, st.EstimatedPrimary.Sum)
	}
}

// sim --explain-sample's records: the sampled share of requests, in the
// schema of /admin/explain, the same bytes in every run of a seed, and a
// run's results unchanged by them.
func TestExplainSample(t *testing.T) {
	run := func(sample float64, shadow string) (*Output, []byte) {
		c := smallConfig(t, "w2", 400)
		c.Policy = "cost_model"
		c.Admission = gateway.AdmitKV
		c.ShadowPolicy = shadow
		var buf bytes.Buffer
		if sample > 0 {
			c.ExplainSample = sample
			enc := json.NewEncoder(&buf)
			c.Explain = func(ex gateway.Explanation) error { return enc.Encode(ex) }
		}
		out, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		return out, buf.Bytes()
	}
	plain, _ := run(0, "")
	out, recs := run(0.25, "kv_aware")
	_, again := run(0.25, "kv_aware")
	if !bytes.Equal(recs, again) {
		t.Fatal("two runs of one seed wrote different explanations")
	}
	if !bytes.Equal(summaryJSON(t, plain.Summary), summaryJSON(t, out.Summary)) {
		t.Fatal("explaining changed the run")
	}
	lines := strings.Split(strings.TrimSpace(string(recs)), "\n")
	if len(lines) < 70 || len(lines) > 130 {
		t.Fatalf("%d records for a quarter of 400 requests", len(lines))
	}
	for _, l := range lines {
		var ex gateway.Explanation
		if err := json.Unmarshal([]byte(l), &ex); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if !gateway.Sampled(ex.Request.ID, 0.25) || ex.Policy != "cost_model" || len(ex.Candidates) != 4 || ex.Why == "" {
			t.Fatalf("record %s", l)
		}
		if ex.Admission.Verdict == gateway.VerdictDispatch && (ex.Winner == nil || ex.Shadow == nil || ex.Shadow.Policy != "kv_aware") {
			t.Fatalf("a dispatch without its winner or shadow: %s", l)
		}
	}
}

func TestExplainSampleValidated(t *testing.T) {
	c := smallConfig(t, "w1", 10)
	c.ExplainSample = 1.5
	if _, err := Simulate(c); err == nil || !strings.Contains(err.Error(), "explain-sample") {
		t.Fatalf("sample 1.5: %v", err)
	}
	c.ExplainSample = 0.5
	if _, err := Simulate(c); err == nil || !strings.Contains(err.Error(), "explain-out") {
		t.Fatalf("no receiver: %v", err)
	}
	c.ExplainSample = 0
	c.ShadowPolicy = "nope"
	if _, err := Simulate(c); err == nil || !strings.Contains(err.Error(), "shadow_policy") {
		t.Fatalf("unknown shadow: %v", err)
	}
}
