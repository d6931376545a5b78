package workload

import (
	"testing"
	"time"
)

func benchOpen(b *testing.B, name string) {
	c := mustConfig(b, name)
	c.Requests = 0
	c.Duration = 0
	c.Duration = time.Duration(1<<62 - 1)
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := src.Next(); !ok {
			b.Fatal("source ran dry")
		}
	}
}

func BenchmarkW1Next(b *testing.B) { benchOpen(b, "w1") }

func BenchmarkW1NextZipf(b *testing.B) {
	c := mustConfig(b, "w1")
	c.Requests = b.N
	c.W1.PopularityZipf = 1.1
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := src.Next(); !ok {
			b.Fatal("source ran dry")
		}
	}
}

func BenchmarkW6Next(b *testing.B) { benchOpen(b, "w6") }

// BenchmarkW6NextMix is BenchmarkW6Next with a tenant/priority mix.
func BenchmarkW6NextMix(b *testing.B) {
	c := mustConfig(b, "w6")
	c.Requests = b.N
	c.Mix = []MixClass{{Tenant: "a", Share: 0.5}, {Tenant: "b", Priority: 1, Share: 0.3}, {Tenant: "c", Priority: 2, Share: 0.2}}
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := src.Next(); !ok {
			b.Fatal("source ran dry")
		}
	}
}

func BenchmarkW4Next(b *testing.B) { benchOpen(b, "w4") }

func BenchmarkW4NextRandomOrder(b *testing.B) {
	c := mustConfig(b, "w4")
	c.Requests = b.N
	c.W4.Order = OrderRandom
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := src.Next(); !ok {
			b.Fatal("source ran dry")
		}
	}
}

func BenchmarkW5Next(b *testing.B) { benchOpen(b, "w5") }

// BenchmarkW6NextGamma is BenchmarkW6Next with bursty gamma arrivals.
func BenchmarkW6NextGamma(b *testing.B) {
	c := mustConfig(b, "w6")
	c.Requests = b.N
	c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: 3}
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, ok := src.Next(); !ok {
			b.Fatal("source ran dry")
		}
	}
}

// BenchmarkW2 measures one request per op: session first turns from Next and
// follow-ups from Done.
func BenchmarkW2(b *testing.B) { benchClosed(b, "w2") }

// BenchmarkW3 measures one request per op: task first steps from Next and
// later steps from Done.
func BenchmarkW3(b *testing.B) { benchClosed(b, "w3") }

func benchClosed(b *testing.B, name string) {
	c := mustConfig(b, name)
	c.Requests = b.N
	src := mustNew(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for n < b.N {
		r, ok := src.Next()
		if !ok {
			break
		}
		n++
		for {
			if r, ok = src.Done(r, r.Arrival+2*time.Second, true); !ok {
				break
			}
			n++
		}
	}
	if n != b.N {
		b.Fatalf("%d requests, want %d", n, b.N)
	}
}
