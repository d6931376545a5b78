package ledger

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

func benchLedger(b *testing.B) *Redis {
	srv := testredis.Start(b)
	r := newLedger(b, srv, uniqueModel(), Config{Timeout: time.Second})
	settle(b, r)
	for i := range 8 { // eight replicas, as a typical vector
		r.Add(i, 1)
	}
	return r
}

// TryAdd then Add (a dispatch's reservation and its release): two
// EVALSHAs over a unix socket to a real redis-server.
func BenchmarkTryAddAdd(b *testing.B) {
	r := benchLedger(b)
	b.ReportAllocs()
	for b.Loop() {
		if !r.TryAdd(3, 10, 1<<20) {
			b.Fatal("refused")
		}
		r.Add(3, -10)
	}
}

// Reserved from the snapshot: what the core's admit pays per candidate.
func BenchmarkReserved(b *testing.B) {
	r := benchLedger(b)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n += r.Reserved(3)
	}
	_ = n
}

// A whole dispatch through a core (Submit, then Finished) on three
// replicas, with a Redis ledger and with a LocalLedger: what the shared
// ledger adds per request.
func benchCore(b *testing.B, led gateway.Ledger) {
	cfg := gateway.DefaultConfig()
	cfg.Model = "m"
	cfg.Router = router.Config{Policy: "least_request"}
	cfg.Ledger = led
	c, err := gateway.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"r0", "r1", "r2"} {
		if _, err := c.AddReplica(gateway.ReplicaConfig{Name: name, CapacityBlocks: 1 << 20}); err != nil {
			b.Fatal(err)
		}
	}
	req := gateway.Request{PromptTokens: 1000, PromptKnown: true, MaxTokens: 200}
	b.ReportAllocs()
	now := time.Duration(0)
	for b.Loop() {
		now += time.Microsecond
		d, _ := c.Submit(now, req)
		if d.Kind != gateway.Dispatched {
			b.Fatalf("%+v", d)
		}
		c.Finished(now, d.Ticket, gateway.Usage{}, nil)
	}
}

func BenchmarkCoreDispatchRedis(b *testing.B) { benchCore(b, benchLedger(b)) }
func BenchmarkCoreDispatchLocal(b *testing.B) { benchCore(b, gateway.NewLocalLedger()) }
