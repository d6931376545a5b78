package results

import "testing"

func TestConclusion(t *testing.T) {
	sums := []Summary{
		{Policy: "round_robin", TTFT: Latency{P99: 1129}, HitRate: 0.347},
		{Policy: "least_request", TTFT: Latency{P99: 1414}, HitRate: 0.353},
		{Policy: "cost_model", TTFT: Latency{P99: 107}, HitRate: 0.941},
	}
	got := Conclusion(sums, "cost_model")
	want := "cost_model: TTFT p99 107 ms, 0.08x least_request's 1414 ms and 0.09x round_robin's 1129 ms; prefix-cache hit rate 94.1% against 35.3% and 34.7%"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if Conclusion(sums[:2], "cost_model") != "" || Conclusion(sums[2:], "cost_model") != "" {
		t.Error("a conclusion without ours or without others")
	}
}
