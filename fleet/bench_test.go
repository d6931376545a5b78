package fleet

import (
	"testing"
)

// benchSim simulates requests of wl on 8 default replicas at the default
// rate, as sim does, on two cores (Config.TwoCores); the OneCore
// benchmarks keep it on one.
func benchSim(b *testing.B, wl string, requests int) { benchSimCores(b, wl, requests, true) }

func benchSimCores(b *testing.B, wl string, requests int, two bool) {
	benchSimFleet(b, wl, requests, 8, two)
}

func benchSimFleet(b *testing.B, wl string, requests, replicas int, two bool) {
	c := DefaultConfig()
	c.TwoCores = two
	w, err := workloadDefault(wl)
	if err != nil {
		b.Fatal(err)
	}
	c.Workload = w
	c.Workload.Requests = requests
	c.Replicas = replicas
	c.Workload.Rate = DefaultRate(wl, c.Replicas)
	b.ReportAllocs()
	var events int64
	for b.Loop() {
		out, err := Simulate(c)
		if err != nil {
			b.Fatal(err)
		}
		events = out.Summary.SimEvents
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*requests), "ns/request")
	b.ReportMetric(float64(events), "events")
}

func BenchmarkSimulateW1_2k(b *testing.B)  { benchSim(b, "w1", 2000) }
func BenchmarkSimulateW1_20k(b *testing.B) { benchSim(b, "w1", 20000) }
func BenchmarkSimulateW1_20kOneCore(b *testing.B) {
	benchSimCores(b, "w1", 20000, false)
}
func BenchmarkSimulateW2_20k(b *testing.B) { benchSim(b, "w2", 20000) }
func BenchmarkSimulateW6_20k(b *testing.B) { benchSim(b, "w6", 20000) }

// The many-replica case: each Lookup asks about 64 candidates.
func BenchmarkSimulateW2_20k64(b *testing.B) { benchSimFleet(b, "w2", 20000, 64, true) }
