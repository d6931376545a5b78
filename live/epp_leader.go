package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// This file runs the endpoint picker's leader election
// (epp.leader_election): client-go's elector on a Lease in the pool's
// namespace. While another picker holds it, this one is a standby: not
// ready (/readyz 503, gRPC health NOT_SERVING but liveness), its pool and
// pods watched all along, and it still answers a stream Envoy sends it.

// leaseName is the Lease the pickers of the pool hold in turn.
func (s *Server) leaseName() string {
	if n := s.cfg.EPP.LeaderElection.LeaseName; n != "" {
		return n
	}
	return "inferrail-epp-" + s.cfg.EPP.Pool.Name
}

// electionIdentity names this picker in the Lease: the pod's name
// (POD_NAME, which the chart sets, else the host name) and a random suffix
// that tells a restarted process from the one before it.
func electionIdentity() string {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	var b [4]byte
	rand.Read(b[:])
	return name + "_" + hex.EncodeToString(b[:])
}

// elect takes part in the election until ctx ends, then gives the lease
// up if it holds it (so a standby takes over at once, not a lease
// duration later). It is called with s.standby set.
func (s *Server) elect(ctx context.Context, leases coordinationv1.LeasesGetter, identity string) {
	le := s.cfg.EPP.LeaderElection
	name, ns := s.leaseName(), s.cfg.EPP.Pool.Namespace
	var mu sync.Mutex // orders a late OnStartedLeading after OnStoppedLeading
	for ctx.Err() == nil {
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: name, Namespace: ns},
			Client:     leases,
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		}
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: name, ReleaseOnCancel: true,
			LeaseDuration: le.LeaseDuration, RenewDeadline: le.RenewDeadline, RetryPeriod: le.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					mu.Lock()
					defer mu.Unlock()
					if lctx.Err() == nil {
						s.standby.Store(false)
						s.log.Info("leading: this endpoint picker holds the lease and is ready", "lease", ns+"/"+name, "identity", identity)
					}
				},
				OnStoppedLeading: func() {
					mu.Lock()
					defer mu.Unlock()
					if !s.standby.Swap(true) && ctx.Err() == nil { // lost, not given up
						s.log.Warn("the lease was lost: standing by", "lease", ns+"/"+name, "identity", identity)
					}
				},
				OnNewLeader: func(holder string) {
					if holder != identity {
						s.log.Info("standing by: another endpoint picker holds the lease", "lease", ns+"/"+name, "holder", holder)
					}
				},
			},
		})
		if err != nil { // the configuration was validated: not expected
			s.log.Error("leader election cannot run", "error", err.Error())
			return
		}
		elector.Run(ctx)
		if !pause(ctx, le.RetryPeriod) {
			return
		}
	}
}
