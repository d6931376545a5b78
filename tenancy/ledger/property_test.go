package ledger

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// TestPropertyCoresOnRedis interleaves random calls on three gateway cores,
// each with its own Redis ledger on one server (so each core's Reserved
// snapshot lags the others' moves and the TryAdd retry runs): after every
// call no replica's total in Redis (as every script read it after its
// write) is above its limit, every core's own reservations are the weights
// of its requests in flight, and once every request has ended Redis holds
// nothing.
func TestPropertyCoresOnRedis(t *testing.T) {
	srv := testredis.Start(t)
	model := uniqueModel()
	settle(t, newLedger(t, srv, model, Config{}))
	cl := newClient(t, srv)
	var refusedTotal, stepsTotal int
	rapid.Check(t, func(rt *rapid.T) {
		const gws = 3
		n := rapid.IntRange(1, 4).Draw(rt, "replicas")
		caps := make([]int, n)
		for i := range caps {
			caps[i] = rapid.IntRange(54, 120).Draw(rt, "capacity") // x 0.75 still above every weight: no empty-replica exception
		}
		adm := rapid.SampledFrom([]gateway.Admission{gateway.AdmitKV, gateway.AdmitTokenFlow}).Draw(rt, "admission")
		over := rapid.SampledFrom([]float64{0.75, 1}).Draw(rt, "overcommit")
		limit := func(i int) int {
			if adm == gateway.AdmitKV {
				return int(float64(caps[i]) * over)
			}
			return caps[i]
		}
		var leds []*Redis
		var cores []*gateway.Core
		for range gws {
			led, err := NewRedis(cl, model, Config{Timeout: 2 * time.Second})
			if err != nil {
				rt.Fatal(err)
			}
			defer led.Close()
			cfg := gateway.DefaultConfig()
			cfg.Model = "m"
			cfg.Router = router.Config{Policy: rapid.SampledFrom([]string{"round_robin", "least_request", "cost_model"}).Draw(rt, "policy")}
			cfg.Admission, cfg.Overcommit, cfg.OutputQuantile = adm, over, 0
			cfg.Queue.MaxRequests = 8
			cfg.Ledger = led
			c, err := gateway.New(cfg)
			if err != nil {
				rt.Fatal(err)
			}
			for i := range n {
				if _, err := c.AddReplica(gateway.ReplicaConfig{Name: fmt.Sprintf("r%d", i), CapacityBlocks: caps[i]}); err != nil {
					rt.Fatal(err)
				}
			}
			leds, cores = append(leds, led), append(cores, c)
		}
		inflight := make([]map[gateway.Ticket]gateway.Decision, gws)
		for g := range gws {
			inflight[g] = map[gateway.Ticket]gateway.Decision{}
		}
		note := func(g int, ds ...gateway.Decision) {
			for _, d := range ds {
				if d.Kind == gateway.Dispatched {
					inflight[g][d.Ticket] = d
				}
			}
		}
		check := func(step int) {
			for i := range n {
				peak := 0
				for _, l := range leds {
					peak = max(peak, at(l.State().Peak, i))
				}
				if peak > limit(i) {
					rt.Fatalf("step %d: replica %d reached %d blocks in redis, limit %d", step, i, peak, limit(i))
				}
			}
			for g, l := range leds {
				own := l.State().Own
				for i := range n {
					sum := 0
					for _, d := range inflight[g] {
						if d.Replica == i {
							sum += d.Weight
						}
					}
					if at(own, i) != sum {
						rt.Fatalf("step %d: gateway %d holds %d on replica %d, its requests weigh %d", step, g, at(own, i), i, sum)
					}
				}
			}
		}
		now := time.Duration(0)
		steps := rapid.IntRange(5, 80).Draw(rt, "steps")
		for step := range steps {
			now += time.Duration(rapid.IntRange(0, 20).Draw(rt, "dt_ms")) * time.Millisecond
			g := rapid.IntRange(0, gws-1).Draw(rt, "gateway")
			c := cores[g]
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0, 1, 2:
				blocks := rapid.IntRange(1, 40).Draw(rt, "blocks")
				d, o := c.Submit(now, gateway.Request{ID: uint64(step + 1), PromptTokens: 16 * blocks, PromptKnown: true})
				note(g, o...)
				note(g, d)
			case 3, 4:
				if len(inflight[g]) > 0 {
					keys := slices.Sorted(maps.Keys(inflight[g]))
					tk := keys[rapid.IntRange(0, len(keys)-1).Draw(rt, "pick")]
					delete(inflight[g], tk)
					note(g, c.Finished(now, tk, gateway.Usage{}, nil)...)
				}
			case 5:
				note(g, c.Poke(now)...)
			}
			check(step)
		}
		// Everything ends.
		for g, c := range cores {
			for _, tk := range slices.Sorted(maps.Keys(inflight[g])) {
				delete(inflight[g], tk)
				note(g, c.Finished(now, tk, gateway.Usage{}, nil)...)
			}
		}
		for round := 0; ; round++ {
			left := 0
			now += time.Minute
			for g, c := range cores {
				note(g, c.Advance(now)...)
				for _, tk := range slices.Sorted(maps.Keys(inflight[g])) {
					delete(inflight[g], tk)
					note(g, c.Finished(now, tk, gateway.Usage{}, nil)...)
				}
				left += c.Queued() + len(inflight[g])
			}
			if left == 0 {
				break
			}
			if round > 100 {
				rt.Fatalf("%d requests left after 100 rounds", left)
			}
		}
		check(steps)
		obs, err := NewRedis(cl, model, Config{Timeout: 2 * time.Second})
		if err != nil {
			rt.Fatal(err)
		}
		defer obs.Close()
		if err := obs.Refresh(bg); err != nil {
			rt.Fatal(err)
		}
		for i := range n {
			if got := obs.Reserved(i); got != 0 {
				rt.Fatalf("replica %d: %d blocks left in redis", i, got)
			}
		}
		for _, l := range leds {
			refusedTotal += int(l.Stats().Refused)
		}
		stepsTotal += steps
	})
	t.Logf("%d steps, %d TryAdds refused by Redis after a stale pre-filter", stepsTotal, refusedTotal)
}
