package fleet

import (
	"bytes"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
)

func smallConfig(t testing.TB, wl string, n int) Config {
	t.Helper()
	c := DefaultConfig()
	c.Workload.Workload = wl
	w, err := workloadDefault(wl)
	if err != nil {
		t.Fatal(err)
	}
	c.Workload = w
	c.Workload.Requests = n
	return c
}

func TestSimulateSmoke(t *testing.T) {
	for _, wl := range []string{"w1", "w2", "w6"} {
		c := smallConfig(t, wl, 300)
		out, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_ = results.FormatTable(&b, []results.Summary{out.Summary})
		t.Logf("%s\n%s", wl, b.String())
		if out.Summary.Completed != 300 {
			t.Fatalf("%s: completed %d of 300", wl, out.Summary.Completed)
		}
	}
	_ = time.Second
}
