package ledger

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferrail/inferrail/internal/testredis"
)

// leaseTTL is the lease of the expiry tests: short, so they wait little.
const leaseTTL = time.Second

// TestKilledGatewayExpires starts a gateway in a child process (this test
// binary again, running TestHelperGateway), lets it reserve 30 blocks, kills
// it with SIGKILL, and measures how long its reservation keeps counting for
// another gateway: at most the lease (1s), at least the lease less the
// heartbeat period (250ms) that may have passed since its last renewal.
func TestKilledGatewayExpires(t *testing.T) {
	t.Parallel() // real time: overlaps the other waits
	srv := testredis.Start(t)
	model := uniqueModel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperGateway$", "-test.count=1")
	cmd.Env = append(os.Environ(), "INFERRAIL_LEDGER_HELPER="+srv.Addr, "INFERRAIL_LEDGER_MODEL="+model)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "ready ") {
				ready <- strings.TrimPrefix(l, "ready ")
				return
			}
		}
		close(ready)
	}()
	var id string
	select {
	case id = <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("the helper gateway did not reserve within 30s")
	}
	if id == "" {
		t.Fatal("the helper gateway exited before it reserved")
	}
	obs := newLedger(t, srv, model, Config{LeaseTTL: leaseTTL})
	refresh(t, obs)
	if got := obs.Reserved(0); got != 30 {
		t.Fatalf("the helper's reservation reads %d, want 30", got)
	}
	time.Sleep(300 * time.Millisecond) // a heartbeat or more since the reservation
	refresh(t, obs)
	if got := obs.Reserved(0); got != 30 {
		t.Fatalf("the living helper's reservation reads %d after its heartbeats, want 30", got)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	gone := waitFor(t, 5*leaseTTL, "the killed gateway's reservation to expire", func() bool {
		return obs.Refresh(bg) == nil && obs.Reserved(0) == 0
	})
	t.Logf("killed gateway %s: its 30 blocks stopped counting %v after SIGKILL (lease_ttl %v, heartbeat every 250ms)", id, gone.Round(time.Millisecond), leaseTTL)
	if gone > leaseTTL+100*time.Millisecond || gone < leaseTTL-250*time.Millisecond-50*time.Millisecond {
		t.Errorf("expired %v after the kill, want within [lease_ttl - refresh, lease_ttl] = [750ms, 1s] (+ polling)", gone)
	}
	// Its vector is gone from Redis, not just uncounted.
	c := newClient(t, srv)
	if n, err := c.HLen(bg, obs.Keys()[1]).Result(); err != nil || n != 1 {
		t.Fatalf("vectors left: %d, %v (want the observer's alone)", n, err)
	}
}

// TestHelperGateway is the child of TestKilledGatewayExpires: it reserves
// 30 blocks on replica 0, prints "ready <id>", and heartbeats until it is
// killed (or a minute passes).
func TestHelperGateway(t *testing.T) {
	addr := os.Getenv("INFERRAIL_LEDGER_HELPER")
	if addr == "" {
		t.Skip("the child of TestKilledGatewayExpires")
	}
	c := redis.NewClient(clientOptions("unix", addr))
	r, err := NewRedis(c, os.Getenv("INFERRAIL_LEDGER_MODEL"), Config{LeaseTTL: leaseTTL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, r)
	if !r.TryAdd(0, 30, 100) {
		t.Fatalf("refused: %+v", r.Stats())
	}
	fmt.Printf("ready %s\n", r.ID())
	time.Sleep(time.Minute)
}

// A gateway whose heartbeat stops (in process: halt, which neither leaves
// nor calls again) stops counting within the lease; one that closes stops
// counting at once.
func TestStoppedHeartbeatExpires(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	model := uniqueModel()
	a := newLedger(t, srv, model, Config{LeaseTTL: leaseTTL})
	b := newLedger(t, srv, model, Config{LeaseTTL: leaseTTL})
	obs := newLedger(t, srv, model, Config{LeaseTTL: leaseTTL})
	settle(t, obs)
	if !a.TryAdd(1, 20, 100) || !b.TryAdd(1, 30, 100) {
		t.Fatal("refused")
	}
	refresh(t, obs)
	if obs.Reserved(1) != 50 {
		t.Fatalf("reads %d, want 50", obs.Reserved(1))
	}
	a.halt()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	refresh(t, obs)
	if obs.Reserved(1) != 20 {
		t.Fatalf("after b closed: %d, want a's 20", obs.Reserved(1))
	}
	gone := waitFor(t, 5*leaseTTL, "the halted gateway's reservation to expire", func() bool {
		return obs.Refresh(bg) == nil && obs.Reserved(1) == 0
	})
	t.Logf("halted gateway: its 20 blocks stopped counting %v after its heartbeat stopped (lease_ttl %v)", gone.Round(time.Millisecond), leaseTTL)
	if gone > leaseTTL+100*time.Millisecond {
		t.Errorf("expired %v after the heartbeat stopped, lease_ttl %v", gone, leaseTTL)
	}
	// A halted gateway that calls again is counted again with its whole
	// state: its next call rewrites its vector.
	a.Add(1, 5)
	refresh(t, obs)
	if obs.Reserved(1) != 25 {
		t.Fatalf("after the halted gateway called again: %d, want 25", obs.Reserved(1))
	}
}
