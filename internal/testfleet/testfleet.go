package testfleet

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/pipenet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/workload"
)

// Gateway is what Run needs of the gateway under test (live.Server).
type Gateway interface {
	Handler() http.Handler
	Run(ctx context.Context) error
	Close()
}

// Config configures Run.
type Config struct {
	// Engine configures every engine server.
	Engine engine.Config
	// Replicas is the number of engines (at least 1).
	Replicas int
	// Gateway makes the gateway in front of the engines, given them as
	// replicas (replica-0 at engine-0 and so on) and the transport that
	// reaches them.
	Gateway func(replicas []config.Replica, transport http.RoundTripper) (Gateway, error)
	// Workload is what bench sends; Warmup leaves the requests arriving
	// before it out of bench's summary.
	Workload workload.Config
	Warmup   time.Duration
}

// Run starts the engines and the gateway, waits a second for the first
// scrapes and probes, sends the workload through the gateway with bench
// (on virtual time, no precise window), stops everything and returns bench's
// output. It must run inside a synctest bubble; it fails the test on any
// error.
func Run(t testing.TB, c Config) *bench.Output {
	t.Helper()
	if c.Replicas < 1 || c.Gateway == nil {
		t.Fatalf("testfleet: %d replicas and a gateway needed", c.Replicas)
	}
	var pn pipenet.Network
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var stops []func()
	var reps []config.Replica
	for i := range c.Replicas {
		addr := fmt.Sprintf("engine-%d:80", i)
		s, err := server.New(server.Config{Engine: c.Engine, EnablePromptTokensDetails: true})
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: s.Handler()}
		ln := pn.Listen(addr)
		wg.Add(2)
		go func() { defer wg.Done(); s.Run(ctx) }()
		go func() { defer wg.Done(); hs.Serve(ln) }()
		stops = append(stops, func() { hs.Close(); ln.Close() })
		reps = append(reps, config.Replica{Name: fmt.Sprintf("replica-%d", i), URL: "http://" + addr})
	}
	gw, err := c.Gateway(reps, &http.Transport{DialContext: pn.Dial, MaxIdleConnsPerHost: 4096})
	if err != nil {
		t.Fatal(err)
	}
	gln := pn.Listen("gateway:80")
	ghs := &http.Server{Handler: gw.Handler()}
	wg.Add(2)
	go func() { defer wg.Done(); gw.Run(ctx) }()
	go func() { defer wg.Done(); ghs.Serve(gln) }()
	time.Sleep(time.Second) // first scrapes and probes
	src, err := workload.New(c.Workload)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: pn.Dial, MaxIdleConnsPerHost: 4096}}
	out, err := bench.Run(context.Background(), bench.Config{BaseURL: "http://gateway:80", Source: src, Client: client, Warmup: c.Warmup, PreciseWindow: -1})
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
	gw.Close() // a recording's last file is written here
	time.Sleep(time.Second)
	return out
}
