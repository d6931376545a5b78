package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/workload"
)

// progressBar draws a one-line bar on stderr for runs that last over a
// second, with the share done and an estimate of the time left. It draws
// nothing when stderr is not a terminal (a log file, a pipe, CI): a bar
// redrawn with carriage returns is noise there.
type progressBar struct {
	w       io.Writer
	start   time.Time
	last    time.Time
	drawn   bool
	off     bool
	delay   time.Duration
	refresh time.Duration
	// live marks a run on real time (bench): no "simulated" clock.
	live bool
	// expected is the run's length in requests when the run itself does
	// not know it (a trace replay counted up front); 0 if unknown.
	expected int
}

func newProgressBar(w io.Writer) *progressBar {
	now := time.Now()
	return &progressBar{w: w, start: now, last: now, delay: time.Second, refresh: 200 * time.Millisecond, off: !isTerminal(w)}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// eta estimates the time left from the share done so far.
func eta(elapsed time.Duration, frac float64) string {
	if frac < 0.02 || frac >= 1 {
		return ""
	}
	left := time.Duration(float64(elapsed) * (1 - frac) / frac)
	return ", about " + left.Round(time.Second).String() + " left"
}

func (b *progressBar) update(p fleet.Progress) {
	if b.off {
		return
	}
	if p.Target == 0 && b.expected > 0 {
		p.Target = b.expected
	}
	now := time.Now()
	if p.Done {
		if b.drawn {
			b.draw(p, now)
			fmt.Fprintln(b.w)
		}
		return
	}
	if now.Sub(b.start) < b.delay || now.Sub(b.last) < b.refresh {
		return
	}
	b.last = now
	b.draw(p, now)
}

func (b *progressBar) draw(p fleet.Progress, now time.Time) {
	b.drawn = true
	elapsed := now.Sub(b.start)
	frac, known := 0.0, true
	switch {
	case p.Done:
		frac = 1
	case p.Target > 0:
		frac = float64(p.Finished) / float64(p.Target)
	case p.Horizon > 0:
		frac = float64(p.Simulated) / float64(p.Horizon)
	default:
		known = false // unknown length: say what is done, not a made-up share
	}
	verb := "simulating"
	if b.live {
		verb = "sending"
	}
	clock := ""
	if !b.live {
		clock = fmt.Sprintf(", %s simulated", p.Simulated.Round(time.Second))
	}
	if !known {
		fmt.Fprintf(b.w, "\r%s: %d requests done%s in %s \x1b[K", verb, p.Finished, clock, elapsed.Round(100*time.Millisecond))
		return
	}
	const width = 30
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	of := ""
	if p.Target > 0 {
		of = fmt.Sprintf(" of %d", p.Target)
	}
	fmt.Fprintf(b.w, "\r%s [%s%s] %3.0f%% %d%s requests done%s in %s%s ", verb,
		strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, p.Finished, of, clock,
		elapsed.Round(100*time.Millisecond), eta(elapsed, frac))
	fmt.Fprint(b.w, "\x1b[K") // clear what a longer line left
}

// countBar draws "label [####....] 42% done/total simulations" for runs
// of many simulations, over a second long, on a terminal only.
type countBar struct {
	b     *progressBar
	label string
}

func newCountBar(w io.Writer, label string) *countBar {
	return &countBar{b: newProgressBar(w), label: label}
}

func (c *countBar) update(done, total int) {
	b := c.b
	now := time.Now()
	if b.off || now.Sub(b.start) < b.delay || (now.Sub(b.last) < b.refresh && done < total) {
		return
	}
	b.last, b.drawn = now, true
	const width = 30
	frac := float64(done) / float64(max(total, 1))
	n := int(frac * width)
	elapsed := now.Sub(b.start)
	fmt.Fprintf(b.w, "\r%s [%s%s] %d/%d simulations in %s%s \x1b[K", c.label, strings.Repeat("#", n), strings.Repeat(".", width-n), done, total,
		elapsed.Round(100*time.Millisecond), eta(elapsed, frac))
}

func (c *countBar) finish() {
	if c.b.drawn {
		fmt.Fprintln(c.b.w)
	}
}

// countSource returns how many requests a replay source gives for seed (0
// when it cannot be read: the run itself will say why).
func countSource(open func(uint64) (workload.Source, error), seed uint64) int {
	src, err := open(seed)
	if err != nil {
		return 0
	}
	n := 0
	for {
		if _, ok := src.Next(); !ok {
			return n
		}
		n++
	}
}
