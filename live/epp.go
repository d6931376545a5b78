package live

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/dynamic"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/inferrail/inferrail/router/gateway"
)

// This file is `inferrail epp`: the Gateway API Inference Extension's
// endpoint-picker protocol, an Envoy ext_proc gRPC service in front of the
// same gateway core `live` routes with. Envoy (Envoy Gateway, kgateway,
// Istio, a GKE gateway) sends each request's headers and body; the picker
// reads them exactly as the HTTP proxy does (inbound.go: parse, weigh,
// submit, wait), answers with the chosen replica in the
// x-gateway-destination-endpoint header and the envoy.lb metadata, or with
// the proxy's own rejection as an immediate response, and watches the
// response go by to end the request in the core with the engine's usage.
// Envoy carries the bytes; nothing here dials an engine.
//
// One ext_proc stream is one HTTP request. A goroutine receives the
// stream's messages (epp_stream.go) and the stream's own goroutine handles
// them in order; a stream that ends early, however it ends, releases what
// the request holds in the core.

// The endpoint-picker protocol's names (GIE's proposal 004, v1.0.0).
const (
	// eppDestination is the request header and envoy.lb metadata key of
	// the picked endpoint, ip:port.
	eppDestination = "x-gateway-destination-endpoint"
	// eppLB is the metadata namespace of the pick and of the served
	// endpoint.
	eppLB = "envoy.lb"
	// eppPrefiller names, for a request the core disaggregated (P/D), its
	// prefill replica's ip:port, for llm-d's routing sidecar on the decode
	// pod (pkg/sidecar/proxy): it sends the prompt there first (max_tokens
	// 1), then decodes with the KV it gets back.
	eppPrefiller = "x-prefiller-host-port"
	// eppServed is the envoy.lb key Envoy sets to the endpoint that served
	// the request (a retry may have used another).
	eppServed = "x-gateway-destination-endpoint-served"
	// eppSubsetNS and eppSubset are the filter metadata of the subset
	// hint: the endpoints the pick must come from.
	eppSubsetNS = "envoy.lb.subset_hint"
	eppSubset   = "x-gateway-destination-endpoint-subset"
)

// eppHealthServices are the gRPC health services the picker reports:
// "" (the server), liveness, readiness, and the ext_proc service itself.
var eppHealthServices = []string{"", "liveness", "readiness", extProcPb.ExternalProcessor_ServiceDesc.ServiceName}

// eppChunk bounds the body chunks sent back to Envoy in streamed mode.
const eppChunk = 60 << 10

// eppHealthEvery is how often the gRPC health statuses are brought up to
// date with readiness.
const eppHealthEvery = 250 * time.Millisecond

// eppOptions are what a test replaces in ServeEPP.
type eppOptions struct {
	// kube is the client the InferencePool is watched with; nil builds one
	// from epp.pool.kubeconfig or the in-cluster configuration.
	kube dynamic.Interface
	// resync is how often the pool and its pods are listed again (0: a
	// minute).
	resync time.Duration
	// leases is the leader election's Lease client; nil builds one as
	// kube.
	leases coordinationv1.LeasesGetter
}

// ServeEPP runs `inferrail epp`: it serves the endpoint-picker protocol
// (Envoy ext_proc, with gRPC health) on epp.listen and AdminHandler on
// admin_listen, runs the background work (Run: scrapes, probes, DNS
// discovery, KV events) and, when epp.pool names an InferencePool, watches
// it and its pods in Kubernetes for the replicas of its model, until ctx
// ends. Then it drains as Serve does: readiness (and the gRPC health of
// every service but liveness) fails at once, streams keep being served for
// drain_delay (stop, when not nil and closed, cuts it short), then
// drain_timeout lets running streams finish before the rest are cut (each
// cut stream is released in the core). It returns nil after a clean drain.
// Addrs reports the ext_proc address as the client one.
func (s *Server) ServeEPP(ctx context.Context, stop <-chan struct{}) error {
	return s.serveEPP(ctx, stop, eppOptions{})
}

// CheckEPP checks what ServeEPP needs beyond the configuration, without
// contacting anything: with epp.pool set, that a Kubernetes client
// configuration can be built (epp.pool.kubeconfig, or the in-cluster one).
func (s *Server) CheckEPP() error {
	if s.cfg.EPP.Pool.Name == "" {
		return nil
	}
	if _, err := s.poolModel(); err != nil {
		return err
	}
	_, err := kubeClient(s.cfg.EPP.Pool.Kubeconfig)
	return err
}

func (s *Server) serveEPP(ctx context.Context, stop <-chan struct{}, o eppOptions) error {
	var watcher *poolWatcher
	var objWatcher *objectiveWatcher
	if s.cfg.EPP.Pool.Name != "" {
		m, err := s.poolModel()
		if err != nil {
			return err
		}
		kube := o.kube
		if kube == nil {
			if kube, err = kubeClient(s.cfg.EPP.Pool.Kubeconfig); err != nil {
				return err
			}
		}
		watcher = s.newPoolWatcher(m, kube, o.resync)
		objWatcher = s.newObjectiveWatcher(kube, o.resync)
	}
	leases := o.leases
	if s.cfg.EPP.LeaderElection.Enabled {
		if leases == nil {
			var err error
			if leases, err = leaseClient(s.cfg.EPP.Pool.Kubeconfig, s.cfg.EPP.LeaderElection.RenewDeadline); err != nil {
				return err
			}
		}
		s.standby.Store(true) // until this picker holds the lease
	}
	lis, err := net.Listen("tcp", s.cfg.EPP.Listen)
	if err != nil {
		return fmt.Errorf("live: listen on %s: %w (change epp.listen in the configuration)", s.cfg.EPP.Listen, err)
	}
	// A buffered body is one message: room for the largest one taken.
	maxMsg := int(s.cfg.MaxBodyBytes) + 1<<20
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg)}
	tlsMode := "off (h2c)"
	if s.cfg.EPP.SecureServing {
		tc, what, err := s.eppTLS()
		if err != nil {
			lis.Close()
			return err
		}
		opts, tlsMode = append(opts, grpc.Creds(credentials.NewTLS(tc))), what
	}
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	extProcPb.RegisterExternalProcessorServer(gs, &eppService{s: s, web: s.Handler()})
	s.setAddr(&s.clientAddr, lis.Addr())

	errs := make(chan error, 2)
	go func() {
		if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errs <- err
		}
	}()
	admin, err := s.serveAdmin(errs)
	if err != nil {
		gs.Stop()
		return err
	}
	if _, al := s.Addrs(); al != nil {
		s.log.Info("serving the endpoint picker", "listen", lis.Addr().String(), "tls", tlsMode, "admin", al.String(), "pool", s.cfg.EPP.Pool.Name)
	} else {
		s.log.Info("serving the endpoint picker", "listen", lis.Addr().String(), "tls", tlsMode, "pool", s.cfg.EPP.Pool.Name)
	}

	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { s.Run(bgCtx) })
	if watcher != nil {
		bg.Go(func() { watcher.run(bgCtx) })
		bg.Go(func() { objWatcher.run(bgCtx) })
	}
	electCtx, stopElection := context.WithCancel(bgCtx)
	defer stopElection()
	if s.cfg.EPP.LeaderElection.Enabled {
		id := electionIdentity()
		s.log.Info("leader election", "lease", s.cfg.EPP.Pool.Namespace+"/"+s.leaseName(), "identity", id)
		bg.Go(func() { s.elect(electCtx, leases, id) })
	}
	bg.Go(func() { s.reportHealth(bgCtx, hs) })
	closeAll := func() {
		gs.Stop()
		if admin != nil {
			admin.Close()
		}
		stopBG()
		bg.Wait()
	}
	select {
	case err := <-errs:
		closeAll()
		return fmt.Errorf("live: serve: %w", err)
	case <-ctx.Done():
	}
	s.Drain()
	stopElection() // the lease given up: a standby takes over now
	s.setHealth(hs)
	s.log.Info("draining", "delay", s.cfg.DrainDelay.String(), "timeout", s.cfg.DrainTimeout.String())
	if s.cfg.DrainDelay > 0 {
		t := time.NewTimer(s.cfg.DrainDelay)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
		}
	}
	// GracefulStop refuses new streams and waits for the running ones;
	// past drain_timeout, Stop cuts them (each is released in the core).
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	t := time.NewTimer(s.cfg.DrainTimeout)
	select {
	case <-done:
		t.Stop()
	case <-t.C:
		s.log.Warn("shutdown", "error", "streams still running after drain_timeout were cut")
		gs.Stop()
		<-done
	}
	hs.Shutdown()
	closeAll()
	s.log.Info("stopped")
	return nil
}

// reportHealth keeps the gRPC health statuses in step with readiness until
// ctx ends.
func (s *Server) reportHealth(ctx context.Context, hs *health.Server) {
	t := time.NewTicker(eppHealthEvery)
	defer t.Stop()
	for {
		s.setHealth(hs)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setHealth sets every gRPC health service: liveness serves while the
// process does; the others while /readyz would answer 200 (a replica of
// every model passed a probe or answered within health.ready_window, no
// drain has begun and, with leader election, this picker holds the lease).
func (s *Server) setHealth(hs *health.Server) {
	ready := healthpb.HealthCheckResponse_NOT_SERVING
	if s.readyNow() {
		ready = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range eppHealthServices {
		st := ready
		if svc == "liveness" {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus(svc, st)
	}
}

// readyNow is /readyz's answer, asked of its handler.
func (s *Server) readyNow() bool {
	rec := newEPPRecorder()
	s.handleReady(rec, nil)
	return rec.code == http.StatusOK
}

// eppService is the ext_proc service.
type eppService struct {
	extProcPb.UnimplementedExternalProcessorServer
	s *Server
	// web answers what is not a generation request, as live's client
	// handler does (/v1/models, the health endpoints, 404 and 405).
	web http.Handler
}

// Process handles one ext_proc stream: one HTTP request through Envoy.
func (e *eppService) Process(srv extProcPb.ExternalProcessor_ProcessServer) error {
	st := newEPPStream(e, srv)
	go st.receive()
	return st.run()
}

// eppRecorder is an http.ResponseWriter that keeps what it is given: the way
// the picker asks live's handlers for an answer it sends as an immediate
// response.
type eppRecorder struct {
	h    http.Header
	code int
	body []byte
}

func newEPPRecorder() *eppRecorder { return &eppRecorder{h: http.Header{}} }

func (r *eppRecorder) Header() http.Header { return r.h }

func (r *eppRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *eppRecorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.body = append(r.body, b...)
	return len(b), nil
}

// grpcError is a stream's end as a gRPC status, its message lower case.
func grpcError(c codes.Code, format string, args ...any) error {
	return status.Errorf(c, format, args...)
}

// endpointOf is a replica's address as the protocol names endpoints:
// host:port of its URL (ip:port for the replicas DNS groups and
// InferencePools find).
func endpointOf(r *replica) string { return r.base.Host }

// endpointList splits a subset hint or a served endpoint, a list value or
// a comma-joined string, into its entries.
func endpointList(vals ...string) []string {
	var out []string
	for _, v := range vals {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}

// matches reports whether endpoint ep (ip:port, or an ip alone, which
// matches any port) names replica r.
func matches(ep string, r *replica) bool {
	have := endpointOf(r)
	if ep == have {
		return true
	}
	if _, _, err := net.SplitHostPort(ep); err == nil {
		return false
	}
	host, _, err := net.SplitHostPort(have)
	return err == nil && strings.Trim(ep, "[]") == host
}

// allowedOf maps a subset hint to the indexes of m's replicas it names
// (empty, not nil, when it names none of them).
func allowedOf(m *model, subset []string) []int {
	allowed := []int{}
	for _, r := range m.live() {
		for _, ep := range subset {
			if matches(ep, r) {
				allowed = append(allowed, r.idx)
				break
			}
		}
	}
	return allowed
}

// replicaAt finds m's replica at endpoint ep, nil when none is.
func replicaAt(m *model, ep string) *replica {
	for _, r := range m.live() {
		if matches(ep, r) {
			return r
		}
	}
	return nil
}

// moveTo accounts a request the gateway sent to r instead of a's replica:
// r is what holds its prompt now. See eppStream.served.
func (m *model) moveTo(a *attempt, req gateway.Request, r *replica) *attempt {
	b := &attempt{}
	req.Allowed = []int{r.idx}
	req.NoQueue = true
	m.submit(b, req)
	m.abort(a, true)
	return b
}

// fallbacks are up to n of m's replicas other than pick that could serve a
// request restricted to allowed (nil: any): healthy, not ejected, not
// prefill-only, the least loaded (in flight, then pending) first.
func fallbacks(m *model, pick *replica, allowed []int, n int) []*replica {
	snap := m.snapshot()
	var out []replicaSnap
	for _, r := range snap.reps {
		switch {
		case r.rep == pick, !r.st.Healthy, r.st.EjectedNow, r.rep.role == gateway.RolePrefill:
			continue
		case allowed != nil && !slices.Contains(allowed, r.rep.idx):
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b replicaSnap) int {
		if c := cmp.Compare(a.st.Load.InFlight, b.st.Load.InFlight); c != 0 {
			return c
		}
		return cmp.Compare(a.st.Load.Pending, b.st.Load.Pending)
	})
	reps := make([]*replica, 0, min(n, len(out)))
	for _, r := range out[:min(n, len(out))] {
		reps = append(reps, r.rep)
	}
	return reps
}
