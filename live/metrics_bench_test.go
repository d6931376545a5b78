package live

import (
	"testing"
	"time"
)

// BenchmarkRequestMetrics is the metric updates of one request served
// whole (what handleGenerate's path counts).
func BenchmarkRequestMetrics(b *testing.B) {
	s := &Server{version: "test"}
	m := newMetrics(s)
	md := &model{name: "m", policy: "cost_model"}
	r := &replica{name: "a"}
	b.ReportAllocs()
	for b.Loop() {
		m.tokenized(md, tokOK)
		m.decisionTime(md, time.Microsecond)
		m.queueWait(md, 0)
		m.decision(md, r)
		m.ttft(md, r, time.Millisecond)
		m.overhead(md, 50*time.Microsecond)
		m.duration(md, r, time.Millisecond)
		m.served(md, 256, 128)
		m.reported(md, 256, 128)
		m.ok(md)
	}
}
