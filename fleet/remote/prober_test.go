package remote

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// outcomes records OnResult calls.
type outcomes struct {
	mu  sync.Mutex
	got map[string][]bool
}

func (o *outcomes) add(name string, ok bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.got == nil {
		o.got = make(map[string][]bool)
	}
	o.got[name] = append(o.got[name], ok)
}

func (o *outcomes) of(name string) []bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]bool(nil), o.got[name]...)
}

func status(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != DefaultHealthPath {
			code = http.StatusNotFound
		}
		w.WriteHeader(code)
	}
}

func TestProber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newMemTransport()
		tr.handle("ok", status(http.StatusOK))
		tr.handle("nocontent", status(http.StatusNoContent))
		tr.handle("down", status(http.StatusServiceUnavailable))
		tr.handle("hang", http.HandlerFunc(hang))
		// "gone" has no handler: connection refused.
		var o outcomes
		p, err := NewProber(ProberConfig{Client: tr.client(), OnResult: o.add})
		if err != nil {
			t.Fatal(err)
		}
		p.SetTargets(map[string]string{"ok": "http://ok", "nocontent": "http://nocontent", "down": "http://down", "hang": "http://hang", "gone": "http://gone"})
		stop := runInBackground(p.Run)
		// Probes start at 0, 1s and 2s; those of "hang" end at 0.5s, 1.5s
		// and 2.5s.
		time.Sleep(2*time.Second + DefaultProbeTimeout + time.Millisecond)
		for name, want := range map[string]bool{"ok": true, "nocontent": true, "down": false, "hang": false, "gone": false} {
			got := o.of(name)
			if len(got) != 3 {
				t.Errorf("%s: %d probes, want 3", name, len(got))
			}
			for _, ok := range got {
				if ok != want {
					t.Errorf("%s: probe ok=%v, want %v", name, ok, want)
				}
			}
			r, ok := p.Result(name)
			if !ok || !r.Probed || r.OK != want || r.Consecutive != 3 || (r.Err == nil) != want {
				t.Errorf("%s: result %+v", name, r)
			}
		}
		if r, _ := p.Result("hang"); !errors.Is(r.Err, context.DeadlineExceeded) || r.Duration != DefaultProbeTimeout {
			t.Errorf("hanging target: %+v; want a deadline error after %v", r, DefaultProbeTimeout)
		}

		// Recovery resets the run; removal stops the probes.
		tr.handle("down", status(http.StatusOK))
		time.Sleep(time.Second)
		if r, _ := p.Result("down"); !r.OK || r.Consecutive != 1 {
			t.Errorf("recovered target: %+v", r)
		}
		p.SetTargets(map[string]string{"ok": "http://ok"})
		n := len(o.of("down"))
		time.Sleep(2 * time.Second)
		if len(o.of("down")) != n {
			t.Error("removed target still probed")
		}
		if _, ok := p.Result("down"); ok {
			t.Error("result for a removed target")
		}
		stop()
	})
}

func TestProberConfig(t *testing.T) {
	for _, cfg := range []ProberConfig{{Interval: -1}, {Timeout: -1}, {Path: "health"}} {
		if _, err := NewProber(cfg); err == nil {
			t.Errorf("NewProber(%+v) succeeded", cfg)
		}
	}
	p, err := NewProber(ProberConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetTargets(map[string]string{"a": "not a url"}); err == nil {
		t.Error("SetTargets accepted a bad URL")
	}
}
