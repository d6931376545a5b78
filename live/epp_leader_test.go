package live

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// Two pickers for one pool with leader election: one holds the Lease and
// is ready, the other stands by (/readyz 503 saying so, gRPC health
// NOT_SERVING but liveness) with the pool's pod known all along; when the
// holder shuts down it gives the lease up and the standby is ready within
// a retry period, not a lease duration. A standby still answers a stream.
func TestEPPLeaderElection(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	host, port, _ := net.SplitHostPort(up.addr)
	pn, _ := strconv.Atoi(port)
	kube := fakeKube(
		poolObj(t, map[string]string{"app": "vllm"}, int32(pn)),
		podObj(t, "p1", "vllm", host, true, false),
	)
	leases := kubefake.NewClientset().CoordinationV1()
	start := func() *testEPP {
		c := eppConfig(t)
		c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS}
		c.EPP.LeaderElection = config.LeaderElection{Enabled: true, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return startEPP(t, c, Deps{}, eppOptions{kube: kube, leases: leases})
	}
	first := start()
	waitUntil(t, "the first picker leading and ready", 10*time.Second, first.readyNow)
	second := start()
	waitUntil(t, "the second picker's pod", 10*time.Second, func() bool { return len(second.models[0].live()) == 1 })
	time.Sleep(500 * time.Millisecond) // five retry periods: it would have taken a free lease
	if second.readyNow() {
		t.Fatal("both pickers are ready")
	}
	rec := newEPPRecorder()
	second.handleReady(rec, nil)
	if rec.code != 503 || !strings.Contains(string(rec.body), "standby") || !strings.Contains(string(rec.body), "inferrail-epp-vllm") {
		t.Fatalf("the standby's /readyz: %d %s", rec.code, rec.body)
	}
	health := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := second.health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	if got := health("readiness"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("the standby's readiness %v", got)
	}
	if got := health("liveness"); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the standby's liveness %v", got)
	}
	// A stream sent to the standby anyway is answered.
	call := second.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)})
	if call.pick.endpoint != up.addr {
		t.Fatalf("the standby's pick: %+v", call.pick)
	}
	call.cancel()

	stopped := time.Now()
	first.stop()
	waitUntil(t, "the standby taking over", 10*time.Second, second.readyNow)
	if d := time.Since(stopped); d > 2*time.Second {
		t.Fatalf("the standby took %v to take over: the lease was not given up", d)
	}
}
