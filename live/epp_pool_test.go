package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

const poolNS = "llm"

func poolObj(t *testing.T, match map[string]string, port int32) *unstructured.Unstructured {
	t.Helper()
	p := inferencePool{
		TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool"},
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: poolNS},
		Spec:       inferencePoolSpec{Selector: poolSelector{MatchLabels: match}, TargetPorts: []poolPort{{Number: port}}},
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: u}
}

func podObj(t *testing.T, name, app, ip string, ready, terminating bool) *unstructured.Unstructured {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: poolNS, Labels: map[string]string{"app": app}},
		Status:     corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
	if terminating {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: u}
}

// fakeKube is a dynamic client that lists InferencePools, pods and both
// InferenceObjective kinds, holding objs.
func fakeKube(objs ...runtime.Object) *fake.FakeDynamicClient {
	return fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{poolGVR: "InferencePoolList", podGVR: "PodList", objectiveGVRs[0]: "InferenceObjectiveList", objectiveGVRs[1]: "InferenceObjectiveList"},
		objs...)
}

// The InferencePool's ready pods, at its first target port, are the
// model's replicas: pods join when ready, leave when unready, terminating
// or deleted (their metric series with them), the pool's selector and port
// changing changes the set, a pool that goes away leaves none (503), and a
// failing watch is retried. The picker routes among them.
func TestEPPPoolWatcher(t *testing.T) {
	kube := fakeKube(
		poolObj(t, map[string]string{"app": "vllm"}, 8000),
		podObj(t, "p1", "vllm", "127.0.0.11", true, false),
		podObj(t, "p2", "vllm", "127.0.0.12", false, false),
		podObj(t, "p3", "vllm", "127.0.0.13", true, true),
		podObj(t, "p4", "other", "127.0.0.14", true, false),
		podObj(t, "p5", "vllm", "", true, false),
	)
	// The cluster serves no InferenceObjectives of the older group (its
	// CRD not installed): the picker goes on without them.
	var absent atomic.Int32
	kube.PrependReactor("list", "inferenceobjectives", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource().Group != objectiveGVRs[1].Group {
			return false, nil, nil
		}
		absent.Add(1)
		return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), "")
	})
	// The first two pod watches fail: the watcher backs off and retries.
	var fails atomic.Int32
	kube.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		if fails.Add(1) <= 2 {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	c := eppConfig(t) // no replicas of its own: the pool's are all
	c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS}
	c.Models[0].Policy = "round_robin"
	logs := &syncBuffer{}
	e := startEPP(t, c, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil))}, eppOptions{kube: kube, resync: 200 * time.Millisecond})
	m := e.models[0]
	replicas := func() []string {
		var out []string
		for _, r := range m.live() {
			out = append(out, r.name)
		}
		slices.Sort(out)
		return out
	}
	want := func(what string, names ...string) {
		t.Helper()
		for i, n := range names {
			names[i] = "pool-vllm-" + n
		}
		waitUntil(t, what, 10*time.Second, func() bool { return slices.Equal(replicas(), names) })
	}
	want("the ready pod", "127.0.0.11:8000")
	if fails.Load() < 3 {
		t.Fatalf("%d pod watches, want the two failures retried", fails.Load())
	}
	call := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)})
	if call.pick.endpoint != "127.0.0.11:8000" || call.pick.meta != call.pick.endpoint {
		t.Fatalf("the pick among the pool's pods: %+v", call.pick)
	}
	call.cancel()
	waitUntil(t, "the request released", 5*time.Second, func() bool { return idle(e.Server) })

	ctx := context.Background()
	pods := kube.Resource(podGVR).Namespace(poolNS)
	if _, err := pods.Update(ctx, podObj(t, "p2", "vllm", "127.0.0.12", true, false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("p2 ready", "127.0.0.11:8000", "127.0.0.12:8000")
	if _, err := pods.Update(ctx, podObj(t, "p2", "vllm", "127.0.0.12", false, false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("p2 unready again", "127.0.0.11:8000")
	if err := pods.Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("p1 gone")
	mfs, _ := e.met.reg.Gather()
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "replica" && strings.Contains(l.GetValue(), "127.0.0.11") {
					t.Fatalf("%s still has a series of the departed replica %s", mf.GetName(), l.GetValue())
				}
			}
		}
	}
	gone := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)})
	if gone.pick.status() != 503 {
		t.Fatalf("with no pod ready: %+v, want 503", gone.pick)
	}

	pools := kube.Resource(poolGVR).Namespace(poolNS)
	if _, err := pools.Update(ctx, poolObj(t, map[string]string{"app": "other"}, 9000), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the new selector and port", "127.0.0.14:9000")
	if _, err := pods.Create(ctx, podObj(t, "p6", "other", "127.0.0.16", true, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a new pod", "127.0.0.14:9000", "127.0.0.16:9000")
	if err := pools.Delete(ctx, "vllm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the pool gone")
	if _, err := pools.Create(ctx, poolObj(t, map[string]string{"app": "vllm"}, 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the pool back")
	if _, err := pods.Update(ctx, podObj(t, "p2", "vllm", "127.0.0.12", true, false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the pool back with a ready pod", "127.0.0.12:8000")
	// The absent group was looked for again every resync, said once.
	if n := strings.Count(logs.String(), "inferenceobjectives not served"); absent.Load() < 2 || n != 1 {
		t.Errorf("the absent InferenceObjective group: listed %d times, logged %d times; want several and once", absent.Load(), n)
	}
}

// Without a Kubernetes configuration, a pool is refused before anything
// is served, with the way out.
func TestEPPPoolNeedsAKubeconfig(t *testing.T) {
	c := eppConfig(t)
	c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS, Kubeconfig: t.TempDir() + "/missing"}
	s, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CheckEPP(); err == nil || !strings.Contains(err.Error(), "epp.pool.kubeconfig") {
		t.Fatalf("CheckEPP: %v, want an error naming epp.pool.kubeconfig", err)
	}
	if err := s.ServeEPP(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "epp.pool.kubeconfig") {
		t.Fatalf("ServeEPP: %v", err)
	}
}

// With index: events, each pod of the pool is subscribed to at
// epp.pool.kv_events_port: the engine's events fill the index, and a
// repeated prompt is predicted cached on the pod that holds it.
func TestEPPPoolKVEvents(t *testing.T) {
	kc := kvevents.DefaultConfig()
	kc.EnableKVCacheEvents, kc.Endpoint, kc.ForceBind, kc.Topic = true, "tcp://127.0.0.1:0", true, "kv"
	up, pub := publishingEngine(t, testEngineConfig(), kc)
	host, port, _ := net.SplitHostPort(up.addr)
	pn, _ := strconv.Atoi(port)
	_, kport, _ := net.SplitHostPort(strings.TrimPrefix(pub.Addr(), "tcp://"))
	kp, _ := strconv.Atoi(kport)
	kube := fakeKube(
		poolObj(t, map[string]string{"app": "vllm"}, int32(pn)),
		podObj(t, "p1", "vllm", host, true, false),
	)
	c := eppConfig(t)
	c.Models[0].Index = config.IndexEvents
	c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS, KVEventsPort: kp, KVEventsTopic: "kv"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	e := startEPP(t, c, Deps{}, eppOptions{kube: kube})
	waitUntil(t, "the pod", 10*time.Second, func() bool { return len(e.models[0].live()) == 1 })
	// ZMQ's slow joiner: send until the pod's event batches are applied.
	rep := e.models[0].live()[0].name
	waitUntil(t, "KV events from the pod", 20*time.Second, func() bool {
		e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(3000, 40), 2, false)}).serve()
		time.Sleep(50 * time.Millisecond)
		return testutil.ToFloat64(e.met.kvEvents.WithLabelValues(e.models[0].name, rep, "applied")) > 0
	})
	prompt := words(9000, 100)
	e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", prompt, 2, false)}).serve()
	time.Sleep(100 * time.Millisecond)
	again := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", prompt, 2, false)})
	again.serve()
	if p := again.respHeaders[strings.ToLower(HeaderPredicted)]; p != "96" {
		t.Fatalf("the repeat predicted %q cached tokens, want 96 (the engine's events)", p)
	}
}

// llm-d's central mode for a pool: the picker binds kv_events_listen and
// the pod's engine connects to it on topic kv@POD_IP:PORT@MODEL, which
// names the pod's replica.
func TestEPPPoolKVEventsListen(t *testing.T) {
	listen := fmt.Sprintf("tcp://127.0.0.1:%d", freeTCPPort(t))
	pn := freeTCPPort(t)
	up := centralEngine(t, pn, listen, fmt.Sprintf("kv@127.0.0.1:%d@%s", pn, server.DefaultModelName))
	host, _, _ := net.SplitHostPort(up.addr)
	kube := fakeKube(
		poolObj(t, map[string]string{"app": "vllm"}, int32(pn)),
		podObj(t, "p1", "vllm", host, true, false),
	)
	c := eppConfig(t)
	c.Models[0].Index = config.IndexEvents
	c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS, KVEventsListen: listen}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	e := startEPP(t, c, Deps{}, eppOptions{kube: kube})
	waitUntil(t, "the pod", 10*time.Second, func() bool { return len(e.models[0].live()) == 1 })
	rep := e.models[0].live()[0].name
	round := 0
	waitUntil(t, "KV events from the pod", 20*time.Second, func() bool {
		round++ // a new prompt each round: a cached one publishes nothing
		e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1000+round*40, 40), 2, false)}).serve()
		time.Sleep(50 * time.Millisecond)
		return testutil.ToFloat64(e.met.kvEvents.WithLabelValues(e.models[0].name, rep, "applied")) > 0
	})
}
