package live

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/live/config"
)

// ledgerGateways starts two gateways in front of one engine whose
// configured KV capacity (60 blocks) holds one of the test's requests but
// not two, with the ledger given.
func ledgerGateways(t *testing.T, backend string) (a, b *testGateway) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.Models[0].Replicas[0].KVCapacityBlocks = 60
	c.Tenancy.Ledger.Backend = backend
	if backend == "redis" {
		rs := testredis.Start(t)
		c.Tenancy.Redis.Address = "unix://" + rs.Addr
		c.Tenancy.Redis.Timeout = 100 * time.Millisecond
		c.Tenancy.Ledger.LeaseTTL, c.Tenancy.Ledger.RefreshInterval = time.Second, 50*time.Millisecond
	}
	deps := func() Deps { return Deps{Encoders: map[string]Encoder{c.Models[0].Name: simModel(t)}} }
	c2 := *c
	return startGatewayDeps(t, c, deps()), startGatewayDeps(t, &c2, deps())
}

// heavy sends a streamed completion of about 44 KV blocks (100 prompt
// tokens and 600 answer tokens) to g and returns its queue time.
func heavy(t *testing.T, g *testGateway, first int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": words(first, 100), "max_tokens": 600, "ignore_eos": true, "stream": true}, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	ms, _ := strconv.ParseFloat(resp.Header.Get(HeaderQueued), 64)
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// TestSharedLedgerAdmitsAsOne: with the Redis ledger, a request to the
// second gateway waits while the first gateway's request holds the
// replica's KV capacity, and is admitted once it ends; with each
// gateway's own ledger it is admitted at once (over-admission).
func TestSharedLedgerAdmitsAsOne(t *testing.T) {
	for _, backend := range []string{"redis", "local"} {
		t.Run(backend, func(t *testing.T) {
			a, b := ledgerGateways(t, backend)
			first := make(chan error, 1)
			go func() { _, err := heavy(t, a, 0); first <- err }()
			waitUntil(t, "the first request in flight at gateway a", 10*time.Second, func() bool { n, _ := a.inFlight(); return n == 1 })
			waitUntil(t, "gateway a's reservation", 10*time.Second, func() bool { return a.reserved() > 0 })
			began := time.Now()
			queued, err := heavy(t, b, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			switch backend {
			case "redis":
				// b waited for a's request to end (600 decode steps at 1 ms
				// or more), then was admitted.
				if queued < 200*time.Millisecond {
					t.Fatalf("gateway b's request waited %v: the shared ledger must hold it while a's fills the replica", queued)
				}
			case "local":
				if queued > 100*time.Millisecond {
					t.Fatalf("gateway b's request waited %v with its own ledger: it cannot see a's reservation", queued)
				}
			}
			t.Logf("%s: the second gateway's request queued %v (its whole request took %v)", backend, queued, time.Since(began))
			waitUntil(t, "every reservation released", 10*time.Second, func() bool { return a.reserved() == 0 && b.reserved() == 0 })
		})
	}
}

// TestSharedLedgerConfigErrors: the shared ledger's settings are checked
// where they are read.
func TestSharedLedgerConfigErrors(t *testing.T) {
	c := config.Default()
	c.Tenancy.Ledger.Backend = "redis"
	c.Models = testConfig(t).Models
	c.Models[0].Replicas = []config.Replica{{Name: "a", URL: "http://127.0.0.1:1"}}
	if _, err := New(&c, Deps{}); err == nil {
		t.Fatal("a redis ledger without tenancy.redis.address was accepted")
	}
}
