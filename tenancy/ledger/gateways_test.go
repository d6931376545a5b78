package ledger

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// The overload runs: three gateway cores (three gateways of one model) in
// front of the same three replicas, each driven from its own goroutine on
// wall-clock time, each submitting heavy requests (weights 8 to 40 blocks
// against 64 blocks per replica) at a steady pace twice what the fleet can
// take, and finishing each 0.5 to 3 ms after its dispatch.
const (
	olGateways = 3
	olReplicas = 3
	olCapacity = 64 // blocks; overcommit 1, so the limit too
	olRequests = 1500
	// olInterval between a gateway's arrivals: together 10 requests per
	// ms against room for about 8 requests of 1.75 ms on average, so
	// about twice the fleet's rate.
	olInterval = 300 * time.Microsecond
)

func overloadConfig(led gateway.Ledger) gateway.Config {
	cfg := gateway.DefaultConfig()
	cfg.Model = "m"
	cfg.Router = router.Config{Policy: "least_request"}
	cfg.OutputQuantile = 0 // weigh prompts only: the weights are the test's
	cfg.Queue.MaxRequests = 32
	cfg.Queue.Timeout = 2 * time.Second
	cfg.Ledger = led
	return cfg
}

// olResult is what one gateway's run did.
type olResult struct {
	dispatched, rejected int
}

// runGateway drives core until its olRequests requests have all ended.
// Poke after every step lets the queue see other gateways' releases.
func runGateway(t *testing.T, core *gateway.Core, seed uint64, freed <-chan struct{}) olResult {
	rng := rand.New(rand.NewPCG(seed, 7))
	start := time.Now()
	type held struct {
		t     gateway.Ticket
		until time.Duration
	}
	var inflight []held
	var res olResult
	note := func(now time.Duration, ds ...gateway.Decision) {
		for _, d := range ds {
			switch d.Kind {
			case gateway.Dispatched:
				res.dispatched++
				inflight = append(inflight, held{d.Ticket, now + time.Duration(500+rng.IntN(2500))*time.Microsecond})
			case gateway.Rejected:
				res.rejected++
			}
		}
	}
	submitted := 0
	next := time.Duration(0) // the next arrival: one every olInterval
	deadline := time.Now().Add(2 * time.Minute)
	for submitted < olRequests || len(inflight) > 0 || core.Queued() > 0 {
		if time.Now().After(deadline) {
			t.Errorf("gateway %d: not done within 2 minutes", seed)
			break
		}
		now := time.Since(start)
		busy := false
		if submitted < olRequests && now >= next {
			submitted++
			next += olInterval
			blocks := 8 + rng.IntN(33)
			d, o := core.Submit(now, gateway.Request{ID: uint64(submitted), PromptTokens: 16 * blocks, PromptKnown: true, Tenant: "t"})
			note(now, d)
			note(now, o...)
			busy = true
		}
		for i := 0; i < len(inflight); {
			if inflight[i].until > now {
				i++
				continue
			}
			tk := inflight[i].t
			inflight[i] = inflight[len(inflight)-1]
			inflight = inflight[:len(inflight)-1]
			note(now, core.Finished(now, tk, gateway.Usage{}, nil)...)
			busy = true
		}
		select {
		case <-freed:
			busy = true
		default:
		}
		note(now, core.Poke(now)...)
		note(now, core.Advance(now)...)
		if !busy {
			time.Sleep(50 * time.Microsecond)
		}
	}
	return res
}

// newOverloadCore builds one gateway's core with the three replicas, named
// and indexed alike in every gateway.
func newOverloadCore(t *testing.T, led gateway.Ledger) *gateway.Core {
	c, err := gateway.New(overloadConfig(led))
	if err != nil {
		t.Fatal(err)
	}
	for i := range olReplicas {
		if _, err := c.AddReplica(gateway.ReplicaConfig{Name: fmt.Sprintf("r%d", i), CapacityBlocks: olCapacity}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// auditedLocal is one gateway's own LocalLedger; every change records the
// sum over all the gateways' ledgers on the replica (what the replica would
// really hold), under one mutex shared by the three.
type auditedLocal struct {
	a *audit
	l *gateway.LocalLedger
}

type audit struct {
	mu     sync.Mutex
	ledger []*gateway.LocalLedger
	peak   [olReplicas]int
}

func (x auditedLocal) Reserved(replica int) int {
	x.a.mu.Lock()
	defer x.a.mu.Unlock()
	return x.l.Reserved(replica)
}

func (x auditedLocal) Add(replica, delta int) {
	x.a.mu.Lock()
	defer x.a.mu.Unlock()
	x.l.Add(replica, delta)
	sum := 0
	for _, l := range x.a.ledger {
		sum += l.Reserved(replica)
	}
	x.a.peak[replica] = max(x.a.peak[replica], sum)
}

// TestThreeGatewaysOverload runs the overload twice: with one Redis ledger
// per gateway on one Redis, the total reserved on every replica (each
// script's own reading after its write: exact, since only a script
// raises a total) never exceeds the limit; with three independent local
// ledgers the same load over-admits, by the ratio logged.
func TestThreeGatewaysOverload(t *testing.T) {
	srv := testredis.Start(t)
	run := func(name string, leds []gateway.Ledger, freed []<-chan struct{}) (olResult, time.Duration) {
		var wg sync.WaitGroup
		results := make([]olResult, olGateways)
		start := time.Now()
		for g := range olGateways {
			core := newOverloadCore(t, leds[g])
			wg.Go(func() { results[g] = runGateway(t, core, uint64(g+1), freed[g]) })
		}
		wg.Wait()
		el := time.Since(start)
		var sum olResult
		for _, r := range results {
			sum.dispatched += r.dispatched
			sum.rejected += r.rejected
		}
		if sum.dispatched+sum.rejected != olGateways*olRequests {
			t.Errorf("%s: %d dispatched + %d rejected of %d", name, sum.dispatched, sum.rejected, olGateways*olRequests)
		}
		return sum, el
	}

	// Redis: one ledger (and one go-redis client) per gateway. An observer
	// also samples the totals every millisecond through its own scripts.
	model := uniqueModel()
	var leds []gateway.Ledger
	var reds []*Redis
	var freed []<-chan struct{}
	for range olGateways {
		r := newLedger(t, srv, model, Config{Timeout: time.Second})
		reds = append(reds, r)
		leds = append(leds, r)
		freed = append(freed, r.Freed())
	}
	obs := newLedger(t, srv, model, Config{Timeout: time.Second})
	settle(t, obs)
	for _, r := range reds {
		refresh(t, r)
	}
	var stop atomic.Bool
	var obsPeak [olReplicas]int
	var obsWG sync.WaitGroup
	obsWG.Go(func() {
		for !stop.Load() {
			if err := obs.Refresh(bg); err == nil {
				for i := range olReplicas {
					obsPeak[i] = max(obsPeak[i], obs.Reserved(i))
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	sumR, elR := run("redis", leds, freed)
	stop.Store(true)
	obsWG.Wait()
	var peakR [olReplicas]int
	var calls, refused, admitted uint64
	for _, r := range reds {
		st := r.State()
		for i := range olReplicas {
			peakR[i] = max(peakR[i], at(st.Peak, i))
		}
		s := r.Stats()
		calls += s.Calls
		refused += s.Refused
		admitted += s.Admitted
		if s.Errors != 0 {
			t.Errorf("redis errors during the run: %+v", s)
		}
	}
	for i := range olReplicas {
		if peakR[i] > olCapacity || obsPeak[i] > olCapacity {
			t.Errorf("redis: replica %d peaked at %d blocks (observer %d) > %d", i, peakR[i], obsPeak[i], olCapacity)
		}
	}
	if admitted != uint64(sumR.dispatched) {
		t.Errorf("redis: %d admissions for %d dispatches", admitted, sumR.dispatched)
	}
	refresh(t, obs)
	for i := range olReplicas {
		if got := obs.Reserved(i); got != 0 {
			t.Errorf("redis: %d blocks left on replica %d after every request ended", got, i)
		}
	}
	t.Logf("redis ledger: %d dispatched, %d rejected in %v; peak reserved per replica %v of %d (observer %v); %d TryAdds refused (another gateway took the room), %d Redis calls",
		sumR.dispatched, sumR.rejected, elR.Round(time.Millisecond), peakR, olCapacity, obsPeak, refused, calls)

	// Independent local ledgers.
	a := &audit{}
	leds = leds[:0]
	for range olGateways {
		l := gateway.NewLocalLedger()
		a.ledger = append(a.ledger, l)
		leds = append(leds, auditedLocal{a, l})
	}
	sumL, elL := run("local", leds, make([]<-chan struct{}, olGateways))
	over := 0.0
	for i := range olReplicas {
		over = max(over, float64(a.peak[i])/olCapacity)
	}
	if over <= 1 {
		t.Errorf("independent ledgers did not over-admit (peaks %v): the load is too light to show anything", a.peak)
	}
	t.Logf("independent local ledgers: %d dispatched, %d rejected in %v; peak reserved per replica %v of %d: up to %.2fx the capacity",
		sumL.dispatched, sumL.rejected, elL.Round(time.Millisecond), a.peak, olCapacity, over)
}
