package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/inferrail/inferrail/fleet"
)

// progressBar draws a one-line bar on stderr for runs that last over a second.
type progressBar struct {
	w       io.Writer
	start   time.Time
	last    time.Time
	drawn   bool
	delay   time.Duration
	refresh time.Duration
	// live marks a run on real time (bench): no "simulated" clock.
	live bool
}

func newProgressBar(w io.Writer) *progressBar {
	now := time.Now()
	return &progressBar{w: w, start: now, last: now, delay: time.Second, refresh: 200 * time.Millisecond}
}

func (b *progressBar) update(p fleet.Progress) {
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
	frac := 0.0
	switch {
	case p.Done:
		frac = 1
	case p.Target > 0:
		frac = float64(p.Finished) / float64(p.Target)
	case p.Horizon > 0:
		frac = float64(p.Simulated) / float64(p.Horizon)
	default:
		// Unknown length (a trace replay): show activity, not a share.
		frac = float64(p.Finished%1000) / 1000
	}
	const width = 30
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	if b.live {
		fmt.Fprintf(b.w, "\rsending [%s%s] %3.0f%% %d requests done in %s ",
			strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, p.Finished, now.Sub(b.start).Round(100*time.Millisecond))
		return
	}
	fmt.Fprintf(b.w, "\rsimulating [%s%s] %3.0f%% %d requests done, %s simulated in %s ",
		strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, p.Finished,
		p.Simulated.Round(time.Second), now.Sub(b.start).Round(100*time.Millisecond))
}
