package procs

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config is a controller's bounds and thresholds; Validate it once.
type Config struct {
	// Max is the most Ps the controller gives the process (at least 1):
	// runtime.GOMAXPROCS as Go sets it at start (the CPUs, or the
	// container's CPU limit). Run reads Go's own value again every
	// LimitEvery and takes it as Max (SetMax).
	Max int
	// LimitEvery is how often Run asks the runtime for the GOMAXPROCS it
	// would pick now (the CPUs the process may use and the container's
	// CPU limit, which a resize changes): each time costs two brief
	// stops of the world. Default 30s.
	LimitEvery time.Duration
	// Interval is how often the process is sampled. Default 250ms.
	Interval time.Duration
	// Busy is the share of a P's time (0 to 1] above which the
	// controller adds Ps: it raises at once to the count at which none
	// would be busier. Default 0.5.
	Busy float64
	// Idle is the share (0 to Busy] under which fewer Ps would each be
	// busy before the controller removes them. Default 0.4.
	Idle float64
	// DownAfter is how many consecutive intervals must allow fewer Ps
	// before the controller lowers. Default 8 (2 s at the default
	// interval).
	DownAfter int
	// WaitLimit is the 99th percentile of goroutines' wait for a P over
	// one interval above which the controller doubles the Ps (up to Max)
	// whatever the CPU says: a process short of Ps, or whose threads the
	// machine does not run, waits before it burns. The runtime's
	// histogram has buckets doubling in width there, so a limit is
	// effectively the bucket bound under it (4.2ms for 5ms). Default 5ms.
	WaitLimit time.Duration
}

// withDefaults fills the zero fields of c with the defaults.
func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.Busy == 0 {
		c.Busy = 0.5
	}
	if c.Idle == 0 {
		c.Idle = min(0.4, c.Busy)
	}
	if c.DownAfter == 0 {
		c.DownAfter = 8
	}
	if c.WaitLimit == 0 {
		c.WaitLimit = 5 * time.Millisecond
	}
	if c.LimitEvery == 0 {
		c.LimitEvery = 30 * time.Second
	}
	return c
}

// Validate reports the first field out of range, after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Max < 1:
		return fmt.Errorf("procs: max must be at least 1, got %d", c.Max)
	case c.Interval < time.Millisecond:
		return fmt.Errorf("procs: interval must be at least 1ms, got %v", c.Interval)
	case !(c.Busy > 0 && c.Busy <= 1):
		return fmt.Errorf("procs: busy must be in (0, 1], got %v", c.Busy)
	case !(c.Idle > 0 && c.Idle <= c.Busy):
		return fmt.Errorf("procs: idle must be in (0, busy=%v], got %v", c.Busy, c.Idle)
	case c.DownAfter < 1:
		return fmt.Errorf("procs: down_after must be at least 1, got %d", c.DownAfter)
	case c.WaitLimit <= 0:
		return errors.New("procs: wait_limit must be positive")
	case c.LimitEvery < c.Interval:
		return fmt.Errorf("procs: limit_every must be at least the interval (%v), got %v", c.Interval, c.LimitEvery)
	}
	return nil
}

// Sample is one interval of the process's life.
type Sample struct {
	// CPU is the CPU time the process used over the interval divided by
	// the interval: cores' worth, user and system.
	CPU float64
	// WaitP99 is the 99th percentile of the time goroutines made ready
	// in the interval waited before they ran; 0 when none was.
	WaitP99 time.Duration
}

// maxBackoff caps how many times DownAfter a lowering waits after
// lowerings that did not hold.
const maxBackoff = 64

// Controller decides the number of Ps from one Sample after another. It is
// a pure state machine (no clock, no runtime calls): Run drives it.
type Controller struct {
	cfg     Config
	procs   int
	backoff int // DownAfter multiplier, 1 to maxBackoff
	below   int // consecutive intervals that allowed fewer Ps
	target  int // the most Ps any of those intervals needed
	since   int // intervals since the last lowering; -1: none yet
}

// New returns a controller starting at start Ps (clamped to [1, Max]).
func New(cfg Config, start int) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Controller{cfg: cfg, procs: min(max(start, 1), cfg.Max), backoff: 1, since: -1}, nil
}

// Procs is the count of Ps the controller last decided.
func (c *Controller) Procs() int { return c.procs }

// Max is the most Ps the controller gives.
func (c *Controller) Max() int { return c.cfg.Max }

// SetMax changes Max to n (at least 1): the CPUs the process may use, or
// its container's CPU limit, changed. Over the new Max, the Ps drop to it
// at once; under it, the controller goes on from where it is (and raises
// up to the new Max as the load needs).
func (c *Controller) SetMax(n int) {
	c.cfg.Max = max(n, 1)
	if c.procs > c.cfg.Max {
		c.procs = c.cfg.Max
		c.below = 0
	}
	c.target = min(c.target, c.cfg.Max)
}

// need is the count of Ps at which cpu keeps each at most share busy.
func (c *Controller) need(cpu, share float64) int {
	if !(cpu > 0) { // 0, negative or NaN: a sample with nothing in it
		return 1
	}
	n := math.Ceil(cpu/share - 1e-9)
	if n >= float64(c.cfg.Max) {
		return c.cfg.Max
	}
	return max(int(n), 1)
}

// Step takes the sample of one interval and returns the Ps to run with.
func (c *Controller) Step(s Sample) int {
	if c.since >= 0 {
		c.since++
	}
	up := c.need(s.CPU, c.cfg.Busy)
	waited := s.WaitP99 > c.cfg.WaitLimit
	if waited {
		up = max(up, min(2*c.procs, c.cfg.Max))
	}
	if up > c.procs {
		// A lowering undone within a few of its own waits did not hold:
		// the next one waits twice as long.
		if c.since >= 0 && c.since <= 4*c.cfg.DownAfter*c.backoff {
			c.backoff = min(2*c.backoff, maxBackoff)
		}
		c.procs, c.below, c.since = up, 0, -1
		return c.procs
	}
	if c.since > 16*c.cfg.DownAfter*c.backoff {
		c.backoff, c.since = 1, -1 // held long enough: forgiven
	}
	down := c.need(s.CPU, c.cfg.Idle)
	if waited || down >= c.procs {
		c.below = 0
		return c.procs
	}
	if c.below == 0 {
		c.target = down
	} else {
		c.target = max(c.target, down)
	}
	c.below++
	if c.below >= c.cfg.DownAfter*c.backoff {
		c.procs, c.below, c.since = c.target, 0, 0
	}
	return c.procs
}
