package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
)

// On a terminal the bar shows the share of the known length and the time
// left; a replay of unknown length shows what is done, never a share.
func TestProgressBarDraws(t *testing.T) {
	var w bytes.Buffer
	b := newProgressBar(&w)
	b.off, b.delay, b.refresh = false, 0, 0 // as on a terminal, drawn at once
	b.start = time.Now().Add(-10 * time.Second)
	b.update(fleet.Progress{Finished: 250, Target: 1000, Simulated: time.Minute})
	if got := w.String(); !strings.Contains(got, " 25% 250 of 1000 requests done") || !strings.Contains(got, "left") {
		t.Errorf("known length: %q", got)
	}
	w.Reset()
	b.update(fleet.Progress{Finished: 1500})
	if got := w.String(); strings.Contains(got, "%") || !strings.Contains(got, "1500 requests done") {
		t.Errorf("unknown length: %q, want no share", got)
	}
	w.Reset()
	b.expected = 3000
	b.update(fleet.Progress{Finished: 1500})
	if got := w.String(); !strings.Contains(got, " 50% 1500 of 3000") {
		t.Errorf("counted replay: %q", got)
	}
}

// Off a terminal (a pipe, a log file, CI) no bar is drawn.
func TestProgressBarOffTerminal(t *testing.T) {
	var w bytes.Buffer
	b := newProgressBar(&w)
	b.delay, b.refresh = 0, 0
	b.update(fleet.Progress{Finished: 5, Target: 10})
	b.update(fleet.Progress{Done: true})
	c := newCountBar(&w, "simulating")
	c.b.delay, c.b.refresh = 0, 0
	c.update(1, 2)
	c.finish()
	if w.Len() != 0 {
		t.Errorf("drew %q into a buffer", w.String())
	}
	if eta(time.Minute, 0.5) != ", about 1m0s left" || eta(time.Minute, 0.01) != "" {
		t.Errorf("eta: %q %q", eta(time.Minute, 0.5), eta(time.Minute, 0.01))
	}
}
