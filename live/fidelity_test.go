package live

import (
	"context"
	"fmt"
	"github.com/inferrail/inferrail/internal/pipenet"
	"math"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/workload"
)

// W1 through bench -> live -> 3 engines and through sim with 3 replicas and
// the same policy: TTFT p50, p99 and hit rate within 10% of each other. On
// virtual time (synctest), so the comparison is of routing, not of this
// machine's timers.
func TestFidelityWithSimulation(t *testing.T) {
	n := 900
	if testing.Short() {
		n = 300
	}
	wl, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = n, fleet.DefaultRate("w1", 3), 3
	ec := engine.DefaultConfig()
	const policy = "cost_model"
	// Both sides run the gateway core with live's default admission (kv).
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Workload, fc.Policy, fc.Replicas, fc.Engine = 3, wl, policy, 3, ec
	fc.ScrapeInterval, fc.Index, fc.SLO, fc.Warmup = 100*time.Millisecond, fleet.IndexApproximate, results.DefaultSLO(), 60*time.Second
	fc.Admission = gateway.Admission(config.DefaultModel().Admission)
	sim, err := fleet.Simulate(fc)
	if err != nil {
		t.Fatal(err)
	}
	var out *bench.Output
	synctest.Test(t, func(t *testing.T) {
		var pn pipenet.Network
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		o := config.Default()
		mo := config.DefaultModel()
		mo.Name, mo.Policy, mo.Index, mo.MaxConcurrency, mo.MaxPending = server.DefaultModelName, policy, config.IndexApproximate, 1024, 1024
		mo.MaxModelLen = ec.MaxModelLen // as the simulator's core knows it
		var stops []func()
		for i := range 3 {
			addr := fmt.Sprintf("engine-%d:80", i)
			s, err := server.New(server.Config{Engine: ec, EnablePromptTokensDetails: true})
			if err != nil {
				t.Fatal(err)
			}
			hs := &http.Server{Handler: s.Handler()}
			ln := pn.Listen(addr)
			wg.Add(2)
			go func() { defer wg.Done(); s.Run(ctx) }()
			go func() { defer wg.Done(); hs.Serve(ln) }()
			stops = append(stops, func() { hs.Close(); ln.Close() })
			mo.Replicas = append(mo.Replicas, config.Replica{Name: fmt.Sprintf("replica-%d", i), URL: "http://" + addr})
		}
		o.Models = []config.Model{mo}
		gw, err := New(&o, Deps{Transport: &http.Transport{DialContext: pn.Dial, MaxIdleConnsPerHost: 4096}, Encoders: map[string]Encoder{mo.Name: simModel(t)}})
		if err != nil {
			t.Fatal(err)
		}
		gln := pn.Listen("gateway:80")
		ghs := &http.Server{Handler: gw.Handler()}
		wg.Add(2)
		go func() { defer wg.Done(); gw.Run(ctx) }()
		go func() { defer wg.Done(); ghs.Serve(gln) }()
		time.Sleep(time.Second) // first scrapes and probes
		src, err := workload.New(wl)
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{DialContext: pn.Dial, MaxIdleConnsPerHost: 4096}}
		out, err = bench.Run(context.Background(), bench.Config{BaseURL: "http://gateway:80", Source: src, Client: client, Warmup: 60 * time.Second, SpinWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		ghs.Close()
		gln.Close()
		for _, s := range stops {
			s()
		}
		client.CloseIdleConnections()
		cancel()
		wg.Wait()
		gw.Close()
		time.Sleep(time.Second)
	})
	b, s := out.Summary, sim.Summary
	if b.Failed != 0 {
		t.Fatalf("%d failed through the gateway: %v", b.Failed, out.Errors)
	}
	t.Logf("TTFT p50/p99: live %.1f/%.1f ms, sim %.1f/%.1f ms; hit rate live %.3f, sim %.3f",
		b.TTFT.P50, b.TTFT.P99, s.TTFT.P50, s.TTFT.P99, b.HitRate, s.HitRate)
	for _, c := range []struct {
		name string
		x, y float64
	}{{"TTFT p50", b.TTFT.P50, s.TTFT.P50}, {"TTFT p99", b.TTFT.P99, s.TTFT.P99}, {"hit rate", b.HitRate, s.HitRate}} {
		if math.Abs(c.x-c.y) > 0.10*c.y {
			t.Errorf("%s: live %.4g, sim %.4g: more than 10%% apart", c.name, c.x, c.y)
		}
	}
}
