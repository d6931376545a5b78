package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inferrail/inferrail/fleet/remote"
	"github.com/inferrail/inferrail/live/config"
)

// This file watches an InferencePool (inference.networking.k8s.io/v1) and
// the pods its selector matches: the ready ones, at the pool's first
// target port, are its model's replicas, handed to the Server the way DNS
// discovery hands a group's addresses (discovered, background.go), so
// joins and leaves behave alike (departed replicas leave rotation, their
// requests in flight end normally, their metric series are deleted).

// The resources watched.
var (
	poolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	podGVR  = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// inferencePool is the part of an InferencePool v1 the picker reads (the
// upstream Go module is not used: the API is stable v1, and these fields
// are all the picker needs).
type inferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              inferencePoolSpec `json:"spec"`
}

// inferencePoolSpec is an InferencePool's spec: which pods, which ports.
type inferencePoolSpec struct {
	// Selector selects the model server pods by their labels.
	Selector poolSelector `json:"selector"`
	// TargetPorts are the pods' ports; the picker uses the first.
	TargetPorts []poolPort `json:"targetPorts"`
	// AppProtocol is http or kubernetes.io/h2c (read, not used: replicas
	// are reached over HTTP/1.1 and h2c ones answer it too).
	AppProtocol string `json:"appProtocol,omitempty"`
}

// poolSelector is an InferencePool v1 label selector (matchLabels only).
type poolSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// poolPort is one of an InferencePool's target ports.
type poolPort struct {
	Number int32 `json:"number"`
}

// poolResync is how often the pool and its pods are listed again by
// default, in case a watch missed an event.
const poolResync = time.Minute

// kubeConfig is the Kubernetes client configuration: a kubeconfig file,
// or the in-cluster configuration (the pod's service account) when path
// is "".
func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("live: epp.pool.kubeconfig: %w", err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("live: epp.pool: not running in a cluster and no epp.pool.kubeconfig given: %w", err)
	}
	return rc, nil
}

// kubeClient builds a dynamic Kubernetes client from kubeConfig(path).
func kubeClient(path string) (dynamic.Interface, error) {
	rc, err := kubeConfig(path)
	if err != nil {
		return nil, err
	}
	c, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("live: epp.pool: kubernetes client: %w", err)
	}
	return c, nil
}

// leaseClient builds the Lease client of the leader election from
// kubeConfig(path), each call bounded by timeout (the elector's own calls
// are bounded by their context but for giving the lease up at shutdown).
func leaseClient(path string, timeout time.Duration) (coordinationv1.LeasesGetter, error) {
	rc, err := kubeConfig(path)
	if err != nil {
		return nil, err
	}
	rc.Timeout = timeout
	c, err := coordinationv1.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("live: epp.leader_election: kubernetes client: %w", err)
	}
	return c, nil
}

// poolGroup is the discovery group of the pool's replicas (their names
// are "pool-NAME-ip:port").
func (s *Server) poolGroup() config.DNSGroup {
	p := s.cfg.EPP.Pool
	return config.DNSGroup{Name: "pool-" + p.Name, Scheme: "http",
		KVEventsPort: p.KVEventsPort, KVEventsReplayPort: p.KVEventsReplayPort, KVEventsTopic: p.KVEventsTopic}
}

// poolModel is the model whose replicas the pool's pods are.
func (s *Server) poolModel() (*model, error) {
	p := s.cfg.EPP.Pool
	m, _, _ := s.lookup(p.Model)
	if m == nil {
		return nil, fmt.Errorf("live: epp.pool.model: no model %q", p.Model)
	}
	g := s.poolGroup()
	for _, d := range m.dns {
		if d.Name == g.Name {
			return nil, fmt.Errorf("live: model %s: dns group %q has the name of the InferencePool's replicas; rename it", m.name, d.Name)
		}
	}
	return m, nil
}

// poolWatcher follows one InferencePool and its pods.
type poolWatcher struct {
	kube     dynamic.Interface
	ns, name string
	resync   time.Duration
	publish  func([]remote.Endpoint)
	log      *slog.Logger
	// last is the endpoint set last published ("" before the first).
	last      string
	published bool
	// failing is the error last logged, so each change is logged once.
	failing string
}

func (s *Server) newPoolWatcher(m *model, kube dynamic.Interface, resync time.Duration) *poolWatcher {
	if resync <= 0 {
		resync = poolResync
	}
	g := s.poolGroup()
	return &poolWatcher{
		kube: kube, ns: s.cfg.EPP.Pool.Namespace, name: s.cfg.EPP.Pool.Name, resync: resync, log: s.log,
		publish: func(eps []remote.Endpoint) { s.discovered(m, g, eps) },
	}
}

// run follows the pool until ctx ends: it lists the pool and its pods,
// publishes the ready endpoints, and watches both, listing again when the
// pool's selector or port changes, when a watch ends and every resync.
// Errors back off (up to 10 s), logged once per change; the replicas known
// stay in rotation meanwhile.
func (w *poolWatcher) run(ctx context.Context) {
	fails := 0
	for ctx.Err() == nil {
		again, err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := 100 * time.Millisecond // a watch that ended: list again soon
		if err != nil {
			fails++
			wait = watchBackoff(fails)
			if msg := err.Error(); msg != w.failing {
				w.failing = msg
				w.log.Warn("inferencepool watch failing; retrying", "pool", w.ns+"/"+w.name, "error", msg, "in", wait.String())
			}
		} else {
			if w.failing != "" {
				w.failing = ""
				w.log.Info("inferencepool watch recovered", "pool", w.ns+"/"+w.name)
			}
			fails = 0
			if again {
				continue
			}
		}
		if !pause(ctx, wait) {
			return
		}
	}
}

// watchBackoff is the wait after the fails-th failure in a row of a
// Kubernetes list or watch: 200 ms doubling, at most 10 s.
func watchBackoff(fails int) time.Duration {
	return min(100*time.Millisecond<<min(fails, 7), 10*time.Second)
}

// pause waits d, false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session is one list of the pool and its pods, then their watches. again
// says the pool changed: list again at once.
func (w *poolWatcher) session(ctx context.Context) (again bool, err error) {
	pools := w.kube.Resource(poolGVR).Namespace(w.ns)
	byName := metav1.ListOptions{FieldSelector: "metadata.name=" + w.name}
	list, err := pools.List(ctx, byName)
	if err != nil {
		return false, fmt.Errorf("list inferencepools: %w", err)
	}
	var spec *inferencePoolSpec
	for i := range list.Items {
		if list.Items[i].GetName() == w.name {
			p, err := decodePool(&list.Items[i])
			if err != nil {
				return false, err
			}
			spec = &p.Spec
		}
	}
	byName.ResourceVersion = list.GetResourceVersion()
	poolW, err := pools.Watch(ctx, byName)
	if err != nil {
		return false, fmt.Errorf("watch inferencepools: %w", err)
	}
	defer poolW.Stop()

	var sel labels.Selector
	var port int32
	ready := map[string]string{} // pod name: ip
	var podEvents <-chan watch.Event
	if spec != nil {
		if sel, port, err = selectorOf(spec); err != nil {
			w.publishNow(nil)
			return false, err
		}
		pods := w.kube.Resource(podGVR).Namespace(w.ns)
		opts := metav1.ListOptions{LabelSelector: sel.String()}
		pl, err := pods.List(ctx, opts)
		if err != nil {
			return false, fmt.Errorf("list pods: %w", err)
		}
		for i := range pl.Items {
			w.track(ready, &pl.Items[i], sel, false)
		}
		opts.ResourceVersion = pl.GetResourceVersion()
		podW, err := pods.Watch(ctx, opts)
		if err != nil {
			return false, fmt.Errorf("watch pods: %w", err)
		}
		defer podW.Stop()
		podEvents = podW.ResultChan()
	}
	// No pool (yet): no replicas.
	w.publishNow(endpoints(ready, port))
	resync := time.NewTimer(w.resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-resync.C:
			return true, nil
		case ev, ok := <-poolW.ResultChan():
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Error:
				return false, fmt.Errorf("watch inferencepools: %w", apierrors.FromObject(ev.Object))
			case watch.Deleted:
				return true, nil
			case watch.Added, watch.Modified:
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok || u.GetName() != w.name {
					continue
				}
				p, err := decodePool(u)
				if err != nil {
					return false, err
				}
				if spec == nil || !samePool(spec, &p.Spec) {
					return true, nil // a new selector or port: list its pods
				}
			}
		case ev, ok := <-podEvents:
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Error:
				return false, fmt.Errorf("watch pods: %w", apierrors.FromObject(ev.Object))
			case watch.Added, watch.Modified, watch.Deleted:
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				w.track(ready, u, sel, ev.Type == watch.Deleted)
				w.publishNow(endpoints(ready, port))
			}
		}
	}
}

// track records whether pod u is a ready member of the pool.
func (w *poolWatcher) track(ready map[string]string, u *unstructured.Unstructured, sel labels.Selector, deleted bool) {
	name := u.GetName()
	delete(ready, name)
	if deleted || !sel.Matches(labels.Set(u.GetLabels())) {
		return
	}
	var pod corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pod); err != nil {
		return
	}
	if ip, ok := podReady(&pod); ok {
		ready[name] = ip
	}
}

// podReady reports a pod's IP when it takes traffic: an IP, the Ready
// condition true, not terminating.
func podReady(p *corev1.Pod) (string, bool) {
	if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return "", false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return p.Status.PodIP, c.Status == corev1.ConditionTrue
		}
	}
	return "", false
}

// endpoints is the ready pods at port, sorted by address.
func endpoints(ready map[string]string, port int32) []remote.Endpoint {
	if port == 0 {
		return nil
	}
	addrs := map[string]bool{}
	for _, ip := range ready {
		addrs[net.JoinHostPort(ip, strconv.Itoa(int(port)))] = true
	}
	out := make([]remote.Endpoint, 0, len(addrs))
	for _, a := range slices.Sorted(maps.Keys(addrs)) {
		out = append(out, remote.Endpoint{Name: a, Addr: a, URL: "http://" + a})
	}
	return out
}

// publishNow hands eps to the Server when they differ from the last set.
func (w *poolWatcher) publishNow(eps []remote.Endpoint) {
	addrs := make([]string, len(eps))
	for i, e := range eps {
		addrs[i] = e.Addr
	}
	key := strings.Join(addrs, ",")
	if w.published && key == w.last {
		return
	}
	w.published, w.last = true, key
	w.log.Info("inferencepool endpoints", "pool", w.ns+"/"+w.name, "ready", len(eps))
	w.publish(eps)
}

// decodePool reads an InferencePool object.
func decodePool(u *unstructured.Unstructured) (*inferencePool, error) {
	var p inferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, fmt.Errorf("inferencepool %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &p, nil
}

// selectorOf is a pool's pod selector and first target port.
func selectorOf(spec *inferencePoolSpec) (labels.Selector, int32, error) {
	if len(spec.Selector.MatchLabels) == 0 {
		return nil, 0, errors.New("inferencepool: spec.selector.matchLabels is empty (it would select every pod)")
	}
	if len(spec.TargetPorts) == 0 || spec.TargetPorts[0].Number < 1 || spec.TargetPorts[0].Number > 65535 {
		return nil, 0, errors.New("inferencepool: spec.targetPorts[0].number must be a port from 1 to 65535")
	}
	sel, err := labels.ValidatedSelectorFromSet(spec.Selector.MatchLabels)
	if err != nil {
		return nil, 0, fmt.Errorf("inferencepool: spec.selector: %w", err)
	}
	return sel, spec.TargetPorts[0].Number, nil
}

// samePool reports whether two specs select the same pods at the same
// port.
func samePool(a, b *inferencePoolSpec) bool {
	pa, pb := int32(0), int32(0)
	if len(a.TargetPorts) > 0 {
		pa = a.TargetPorts[0].Number
	}
	if len(b.TargetPorts) > 0 {
		pb = b.TargetPorts[0].Number
	}
	return pa == pb && maps.Equal(a.Selector.MatchLabels, b.Selector.MatchLabels)
}
