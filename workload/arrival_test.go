package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// gapStats returns the mean and coefficient of variation of the gaps
// between consecutive arrivals, the first measured from 0.
func gapStats(arrivals []time.Duration) (mean, cv float64) {
	var prev time.Duration
	var sum, sum2 float64
	for _, a := range arrivals {
		g := (a - prev).Seconds()
		sum += g
		sum2 += g * g
		prev = a
	}
	n := float64(len(arrivals))
	mean = sum / n
	return mean, math.Sqrt(sum2/n-mean*mean) / mean
}

// TestGammaArrivals measures the gamma arrival process over 50k arrivals:
// the mean gap is 1/rate and the CV the configured one.
func TestGammaArrivals(t *testing.T) {
	for _, cv := range []float64{0.5, 1, 3} {
		t.Run(fmt.Sprint(cv), func(t *testing.T) {
			c := mustConfig(t, "w6")
			c.Rate = 50
			c.Requests = 50000
			c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: cv}
			reqs := drainOpen(mustNew(t, c))
			if len(reqs) != c.Requests {
				t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
			}
			at := make([]time.Duration, len(reqs))
			for i, r := range reqs {
				if i > 0 && r.Arrival < reqs[i-1].Arrival {
					t.Fatal("arrivals out of order")
				}
				at[i] = r.Arrival
			}
			mean, got := gapStats(at)
			// The sample mean's standard error is cv/sqrt(n) of the mean:
			// 1.3% for cv 3; allow 3% or 4 standard errors.
			tol := max(0.03, 4*cv/math.Sqrt(float64(len(at))))
			if want := 1 / c.Rate; math.Abs(mean-want) > tol*want {
				t.Fatalf("mean gap %.5fs, want %.5fs ±%.1f%%", mean, want, 100*tol)
			}
			if math.Abs(got-cv) > 0.05*cv {
				t.Fatalf("measured cv %.4f, want %v ±5%%", got, cv)
			}
			t.Logf("cv %v: mean gap %.5fs (want %.5f), measured cv %.4f", cv, mean, 1/c.Rate, got)
		})
	}
}

// TestArrivalEveryWorkload checks that the arrival process drives every
// open-loop process: the requests of w1, w4 and w6, the session and task
// starts of w2 and w3 (Next without Done), the batch starts of w5 (one
// request per batch, no window) and the background of w7 (no burst yet).
func TestArrivalEveryWorkload(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Rate = 40
			c.Requests = 0
			c.Duration = time.Duration(math.MaxInt64)
			c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: 2}
			rate := c.Rate
			switch name {
			case "w2":
				rate /= float64(c.W2.TurnsMin+c.W2.TurnsMax) / 2
			case "w3":
				rate /= float64(c.W3.StepsMin+c.W3.StepsMax) / 2
			case "w5":
				c.W5.BatchSize, c.W5.BurstWindow = 1, 0
			case "w7":
				// Only the background: the first burst is after the
				// 50k arrivals (1250s).
				c.W7.FirstBurst = 24 * time.Hour
			}
			src := mustNew(t, c)
			at := make([]time.Duration, 50000)
			for i := range at {
				r, ok := src.Next()
				if !ok {
					t.Fatalf("source ran dry after %d", i)
				}
				at[i] = r.Arrival
			}
			mean, cv := gapStats(at)
			if want := 1 / rate; math.Abs(mean-want) > 0.04*want {
				t.Fatalf("mean gap %.5fs, want %.5fs ±4%%", mean, want)
			}
			if math.Abs(cv-2) > 0.1 {
				t.Fatalf("measured cv %.4f, want 2 ±5%%", cv)
			}
		})
	}
}

// TestGammaSampler checks gammaRand's mean (k) and variance (k) over a wide
// range of shapes, including the boosted k < 1 and huge k (tiny cv).
func TestGammaSampler(t *testing.T) {
	r := newRand(1, "test/gamma")
	for _, k := range []float64{1e-4, 0.05, 0.3, 0.999, 1, 2.5, 100, 1e6, 1e12} {
		const n = 100000
		var sum, sum2 float64
		for range n {
			x := gammaRand(r, k)
			if !(x >= 0) || math.IsInf(x, 0) {
				t.Fatalf("k %v: draw %v", k, x)
			}
			sum += x
			sum2 += x * x
		}
		mean := sum / n
		sd := math.Sqrt(sum2/n - mean*mean)
		// Standard error of the mean: sqrt(k/n).
		if math.Abs(mean-k) > 5*math.Sqrt(k/n) {
			t.Fatalf("k %v: mean %v", k, mean)
		}
		// The sd estimate of very skewed shapes is noisy; skip it for
		// k < 0.05 (excess kurtosis 6/k).
		if k >= 0.05 && math.Abs(sd/math.Sqrt(k)-1) > 0.05 {
			t.Fatalf("k %v: sd %v, want %v", k, sd, math.Sqrt(k))
		}
	}
}

// TestPoissonStreamUnchanged checks that the default process draws one
// ExpFloat64 per gap from its stream, as before gamma existed.
func TestPoissonStreamUnchanged(t *testing.T) {
	c := mustConfig(t, "w6")
	a := newArrivals(&c, "w6/arrivals", c.Rate)
	r := newRand(c.Seed, "w6/arrivals")
	var tsec float64
	for range 1000 {
		tsec += r.ExpFloat64() / c.Rate
		got, ok := a.next()
		if !ok || got != time.Duration(tsec*1e9) {
			t.Fatalf("arrival %v, want %v", got, time.Duration(tsec*1e9))
		}
	}
}

func BenchmarkGammaRand(b *testing.B) {
	for _, cv := range []float64{0.5, 3} {
		b.Run(fmt.Sprint(cv), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			k := 1 / (cv * cv)
			b.ReportAllocs()
			for b.Loop() {
				gammaRand(r, k)
			}
		})
	}
}
