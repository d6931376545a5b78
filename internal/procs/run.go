package procs

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"
)

// Change is one decision that changed the Ps (or their Max), for a log
// line.
type Change struct {
	From, To int
	// Max is the most Ps now: the runtime's own GOMAXPROCS, read again
	// every Config.LimitEvery.
	Max    int
	Sample Sample
}

// Run samples the process every cfg.Interval and sets GOMAXPROCS to what a
// Controller decides, from cfg.Max on, until ctx ends; every
// cfg.LimitEvery it takes the GOMAXPROCS Go itself would pick now as the
// controller's Max (a container resized), as setting GOMAXPROCS stops the
// runtime's own updates. When ctx ends it hands GOMAXPROCS back to the
// runtime (runtime.SetDefaultGOMAXPROCS). onChange, when not nil, is called
// after each change. Run changes process-wide state: only a program's main
// should call it, once.
func Run(ctx context.Context, cfg Config, onChange func(Change)) error {
	s, err := newProcessSampler()
	if err != nil {
		return err
	}
	return run(ctx, cfg, s.sample, runtime.GOMAXPROCS, runtimeDefault, onChange)
}

// runtimeDefault gives GOMAXPROCS back to the runtime, which sets it as at
// start (and follows the container's limit from then on), and returns it.
func runtimeDefault() int {
	runtime.SetDefaultGOMAXPROCS()
	return runtime.GOMAXPROCS(0)
}

// run is Run with the process's sampler, setter and runtime default given.
func run(ctx context.Context, cfg Config, sample func() Sample, set func(int) int, limit func() int, onChange func(Change)) error {
	c, err := New(cfg, cfg.Max)
	if err != nil {
		return err
	}
	cfg = c.cfg
	set(cfg.Max)
	defer limit()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	every := max(int(cfg.LimitEvery/cfg.Interval), 1)
	sample() // the first interval starts now
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s := sample()
		from, fromMax := c.Procs(), c.Max()
		check := n%every == 0
		if check {
			// The runtime's value is in place until set below.
			c.SetMax(limit())
		}
		to := c.Step(s)
		if check || to != from {
			set(to)
		}
		if onChange != nil && (to != from || c.Max() != fromMax) {
			onChange(Change{From: from, To: to, Max: c.Max(), Sample: s})
		}
	}
}

// schedLatencies is the runtime's histogram of the time goroutines spent
// runnable before they ran.
const schedLatencies = "/sched/latencies:seconds"

// processSampler measures this process: CPU time from getrusage, waits for
// a P from the runtime's scheduler histogram, each as the change since the
// previous call.
type processSampler struct {
	m       []metrics.Sample
	last    []uint64
	lastCPU time.Duration
	lastAt  time.Time
}

func newProcessSampler() (*processSampler, error) {
	m := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil, fmt.Errorf("procs: this Go runtime has no %s histogram", schedLatencies)
	}
	return &processSampler{m: m}, nil
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (p *processSampler) sample() Sample {
	now, cpu := time.Now(), processCPU()
	metrics.Read(p.m)
	h := p.m[0].Value.Float64Histogram()
	var s Sample
	if !p.lastAt.IsZero() {
		if wall := now.Sub(p.lastAt); wall > 0 {
			s.CPU = float64(cpu-p.lastCPU) / float64(wall)
		}
		s.WaitP99 = p99(h.Counts, p.last, h.Buckets)
	}
	p.lastAt, p.lastCPU = now, cpu
	p.last = append(p.last[:0], h.Counts...)
	return s
}

// p99 is the 99th percentile of the counts added since last (a histogram
// with len(counts)+1 bucket bounds in seconds): the upper bound of the
// bucket it falls in, or its lower bound when that is infinite.
func p99(counts, last []uint64, bounds []float64) time.Duration {
	var total uint64
	for i, n := range counts {
		if i < len(last) {
			n -= last[i]
		}
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(0.99 * float64(total)))
	var seen uint64
	for i, n := range counts {
		if i < len(last) {
			n -= last[i]
		}
		if seen += n; seen >= rank {
			b := bounds[i+1]
			if math.IsInf(b, 1) {
				b = bounds[i]
			}
			return time.Duration(b * float64(time.Second))
		}
	}
	return 0
}
