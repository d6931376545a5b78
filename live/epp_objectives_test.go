package live

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// objectiveObj is an InferenceObjective of group gvr for pool (priority nil:
// unset).
func objectiveObj(gvr schema.GroupVersionResource, name, pool string, priority *int64) *unstructured.Unstructured {
	spec := map[string]any{"poolRef": map[string]any{"name": pool}}
	if priority != nil {
		spec["priority"] = *priority
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": "InferenceObjective",
		"metadata": map[string]any{"name": name, "namespace": poolNS},
		"spec":     spec,
	}}
}

func prio(p int64) *int64 { return &p }

// The picker reads the pool's InferenceObjectives (llm-d's group and the
// Inference Extension's, llm-d's winning a name in both; another pool's
// ignored) and gives a request the priority of the objective its header
// names: higher first out of the queue, negative shed at once when no
// replica can take it, unknown or unset 0. Neither header reaches the
// engine; changes to the objectives apply to the next request.
func TestEPPInferenceObjectives(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	host, port, _ := net.SplitHostPort(up.addr)
	pn, _ := strconv.Atoi(port)
	llmd, legacy := objectiveGVRs[0], objectiveGVRs[1]
	kube := fakeKube(
		poolObj(t, map[string]string{"app": "vllm"}, int32(pn)),
		podObj(t, "p1", "vllm", host, true, false),
		objectiveObj(llmd, "critical", "vllm", prio(10)),
		objectiveObj(llmd, "sheddable", "vllm", prio(-5)),
		objectiveObj(llmd, "unset", "vllm", nil),
		objectiveObj(llmd, "elsewhere", "other-pool", prio(99)),
		objectiveObj(legacy, "critical", "vllm", prio(1)),
		objectiveObj(legacy, "legacy", "vllm", prio(3)),
	)
	c := eppConfig(t)
	c.EPP.Pool = config.InferencePool{Name: "vllm", Namespace: poolNS}
	c.Models[0].MaxConcurrency = 1
	c.Models[0].Queue.MaxRequests = 10
	c.Models[0].MaxPriority = 20
	e := startEPP(t, c, Deps{}, eppOptions{kube: kube, resync: time.Hour})
	// Both groups are listed, each on its own.
	waitUntil(t, "the pod and both groups' objectives", 10*time.Second, func() bool {
		_, legacyKnown := e.objectives.priority("legacy")
		_, llmdKnown := e.objectives.priority("unset")
		return len(e.models[0].live()) == 1 && legacyKnown && llmdKnown
	})
	for name, want := range map[string]int32{"critical": 10, "sheddable": -5, "unset": 0, "legacy": 3} {
		if p, known := e.objectives.priority(name); !known || p != want {
			t.Errorf("objective %s: priority %d (known %v), want %d", name, p, known, want)
		}
	}
	if _, known := e.objectives.priority("elsewhere"); known {
		t.Error("another pool's objective was taken")
	}

	req := func(i int, hdr map[string]string) envoyReq {
		return envoyReq{path: "/v1/completions", body: completionBody("", words(100*i, 10), 2, false), header: hdr}
	}
	blocker := e.open(t, req(1, map[string]string{HeaderObjective: "critical"}))
	if blocker.pick.endpoint != up.addr {
		t.Fatalf("pick %+v", blocker.pick)
	}
	for _, h := range pickerHeaders {
		if !slices.Contains(blocker.pick.removed, h) {
			t.Errorf("header %s not removed (removed %v)", h, blocker.pick.removed)
		}
	}
	// The replica is busy: a sheddable request is refused at once.
	shed := e.open(t, req(2, map[string]string{HeaderObjective: "sheddable"}))
	if shed.pick.status() != 429 || shed.pick.errorCode(t) != "no_capacity" {
		t.Fatalf("sheddable with the replica busy: %d %s, want 429 no_capacity", shed.pick.status(), shed.pick.immediate.GetBody())
	}
	// The others queue (one at a time, so their arrival order is known),
	// and leave it highest priority first, then in arrival order.
	var queue []*eppCall
	for i, hdr := range []map[string]string{
		nil,                              // 0
		{HeaderObjective: "unset"},       // 0
		{HeaderObjectiveOld: "legacy"},   // 3
		{HeaderObjective: "no-such"},     // 0
		{HeaderObjectiveOld: "critical"}, // 10, llm-d's
	} {
		queue = append(queue, e.send(t, req(3+i, hdr)))
		waitUntil(t, "the request queued", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == i+1 })
	}
	blocker.cancel()
	for n, i := range []int{4, 2, 0, 1, 3} {
		queue[i].readPick()
		if queue[i].pick.endpoint != up.addr {
			t.Fatalf("request %d: pick %+v", i, queue[i].pick)
		}
		if _, _, q, _ := coreLoad(e.Server); q != 4-n {
			t.Fatalf("after request %d was picked %d are queued, want %d: another left first", i, q, 4-n)
		}
		queue[i].cancel()
	}
	waitUntil(t, "the picker idle", 5*time.Second, func() bool { return idle(e.Server) })

	// An objective changed and one deleted: the next requests see it.
	res := kube.Resource(llmd).Namespace(poolNS)
	if _, err := res.Update(context.Background(), objectiveObj(llmd, "sheddable", "vllm", prio(2)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := res.Delete(context.Background(), "critical", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the changes", 5*time.Second, func() bool {
		p, _ := e.objectives.priority("sheddable")
		q, _ := e.objectives.priority("critical")
		return p == 2 && q == 1 // the legacy group's critical now
	})
	blocker = e.open(t, req(8, nil))
	again := e.send(t, req(9, map[string]string{HeaderObjective: "sheddable"}))
	waitUntil(t, "no longer sheddable: queued", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == 1 })
	blocker.cancel()
	again.readPick()
	if again.pick.immediate != nil || again.pick.endpoint != up.addr {
		t.Fatalf("after the wait: %+v", again.pick)
	}
	again.cancel()
}

// llm-d's fairness id is the request's flow in the queue (deficit round
// robin between flows of a class): three requests of one flow queued
// before one of another leave a, b, a, a.
func TestEPPFairnessID(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := eppConfig(t, up)
	c.Models[0].MaxConcurrency = 1
	c.Models[0].Queue.MaxRequests = 10
	e := startEPP(t, c, Deps{}, eppOptions{})
	req := func(i int, hdr map[string]string) envoyReq {
		return envoyReq{path: "/v1/completions", body: completionBody("", words(100*i, 10), 2, false), header: hdr}
	}
	blocker := e.open(t, req(1, nil))
	var queue []*eppCall
	for i, hdr := range []map[string]string{
		{HeaderFairness: "a"}, {HeaderFairness: "a"}, {HeaderFairness: "a"}, {HeaderFairnessOld: "b"},
	} {
		queue = append(queue, e.send(t, req(2+i, hdr)))
		waitUntil(t, "the request queued", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == i+1 })
	}
	blocker.cancel()
	for n, i := range []int{0, 3, 1, 2} {
		queue[i].readPick()
		if _, _, q, _ := coreLoad(e.Server); q != 3-n {
			t.Fatalf("after request %d was picked %d are queued, want %d: another left first", i, q, 3-n)
		}
		queue[i].cancel()
	}
}
