package live

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
)

// This file gives the endpoint picker the priorities of InferenceObjectives,
// as llm-d's picker reads them: a request names one by header, and the
// objective's priority, an integer (higher first, negative sheddable),
// becomes the request's class in the gateway core. Objectives are watched
// in the InferencePool's namespace, those whose poolRef names the pool.

// The InferenceObjective resources watched: llm-d's group first, then the
// Inference Extension's, where the API began (still served by clusters
// that installed it; llm-d reads it too, as deprecated). An objective named
// in both counts as llm-d's.
var objectiveGVRs = []schema.GroupVersionResource{
	{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferenceobjectives"},
	{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferenceobjectives"},
}

// The request headers of llm-d's picker the picker reads, each under
// llm-d's name and the older one: the objective a request names and its
// fairness flow. None goes on to the engine.
const (
	HeaderObjective    = "X-Llm-D-Inference-Objective"
	HeaderObjectiveOld = "X-Gateway-Inference-Objective"
	HeaderFairness     = "X-Llm-D-Inference-Fairness-Id"
	HeaderFairnessOld  = "X-Gateway-Inference-Fairness-Id"
)

// pickerHeaders are llm-d's request headers, removed from every pick.
var pickerHeaders = []string{"x-llm-d-inference-objective", "x-gateway-inference-objective",
	"x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id"}

// headerOf returns the value of the header named name, else of old.
func headerOf(h http.Header, name, old string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	return h.Get(old)
}

// objectives are the priorities of the pool's InferenceObjectives by name;
// the zero value knows none.
type objectives struct {
	table atomic.Pointer[map[string]int32]
}

// priority is the priority of the objective named name: 0 when it is not
// known (llm-d's reading of an unset priority).
func (o *objectives) priority(name string) (p int32, known bool) {
	t := o.table.Load()
	if t == nil {
		return 0, false
	}
	p, known = (*t)[name]
	return p, known
}

// applyPickerHeaders reads llm-d's request headers into in, once weigh
// has read inferrail's. A fairness id is in's tenant (its flow in the
// queue) unless x-inferrail-tenant names one (it outranks the body's
// user). The priority of the objective h names is in's class: a negative
// one is sheddable, rejected at once rather than queued when no replica
// can take it (as llm-d's picker sheds negative priorities when the pool
// is saturated), at the lowest class. A request without an objective
// keeps the class x-inferrail-priority gave it.
func (s *Server) applyPickerHeaders(h http.Header, in *inbound) {
	if id := headerOf(h, HeaderFairness, HeaderFairnessOld); id != "" && h.Get(HeaderTenant) == "" {
		in.req.Tenant = id
	}
	name := headerOf(h, HeaderObjective, HeaderObjectiveOld)
	if name == "" {
		return
	}
	p, _ := s.objectives.priority(name)
	in.req.Priority = int(max(p, 0))
	in.req.NoQueue = p < 0
}

// objectiveWatcher follows the InferenceObjectives of one pool.
type objectiveWatcher struct {
	kube     dynamic.Interface
	ns, pool string
	resync   time.Duration
	log      *slog.Logger
	into     *objectives

	mu      sync.Mutex
	byGroup []map[string]int32 // per objectiveGVRs entry
}

func (s *Server) newObjectiveWatcher(kube dynamic.Interface, resync time.Duration) *objectiveWatcher {
	if resync <= 0 {
		resync = poolResync
	}
	return &objectiveWatcher{
		kube: kube, ns: s.cfg.EPP.Pool.Namespace, pool: s.cfg.EPP.Pool.Name, resync: resync, log: s.log, into: &s.objectives,
		byGroup: make([]map[string]int32, len(objectiveGVRs)),
	}
}

// run follows every objective group until ctx ends.
func (w *objectiveWatcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range objectiveGVRs {
		wg.Go(func() { w.follow(ctx, i) })
	}
	wg.Wait()
}

// follow lists and watches one group's objectives, listing again every
// resync and when a watch ends. Errors back off (up to 10 s) and are
// logged once per change; a group the cluster does not serve (its CRD not
// installed) is looked for again every resync, said once at info level.
// What was known stays in force meanwhile.
func (w *objectiveWatcher) follow(ctx context.Context, i int) {
	gvr := objectiveGVRs[i]
	what := gvr.Resource + "." + gvr.Group
	failing, fails := "", 0
	for ctx.Err() == nil {
		err := w.session(ctx, i)
		if ctx.Err() != nil {
			return
		}
		wait := 100 * time.Millisecond
		switch {
		case err == nil:
			if failing != "" {
				w.log.Info("inferenceobjective watch recovered", "resource", what)
			}
			failing, fails = "", 0
		case apierrors.IsNotFound(err):
			wait = w.resync
			if failing != "absent" {
				failing = "absent"
				w.log.Info("inferenceobjectives not served by the cluster (no CRD): objectives of this group are not read", "resource", what)
			}
		default:
			fails++
			wait = watchBackoff(fails)
			if msg := err.Error(); msg != failing {
				failing = msg
				w.log.Warn("inferenceobjective watch failing; retrying", "resource", what, "error", msg, "in", wait.String())
			}
		}
		if !pause(ctx, wait) {
			return
		}
	}
}

// session is one list of group i's objectives, then its watch, until the
// watch ends or the resync is due.
func (w *objectiveWatcher) session(ctx context.Context, i int) error {
	res := w.kube.Resource(objectiveGVRs[i]).Namespace(w.ns)
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	table := map[string]int32{}
	for j := range list.Items {
		if p, ok := w.ofPool(&list.Items[j]); ok {
			table[list.Items[j].GetName()] = p
		}
	}
	w.publish(i, table)
	wt, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer wt.Stop()
	resync := time.NewTimer(w.resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
			return nil
		case ev, ok := <-wt.ResultChan():
			if !ok {
				return nil
			}
			if ev.Type == watch.Error {
				return fmt.Errorf("watch: %w", apierrors.FromObject(ev.Object))
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			table = maps.Clone(table)
			delete(table, u.GetName())
			if p, ok := w.ofPool(u); ok && ev.Type != watch.Deleted {
				table[u.GetName()] = p
			}
			w.publish(i, table)
		}
	}
}

// ofPool returns u's priority when u is an objective of the watched pool
// (its poolRef names the pool; its group, when given, is the
// InferencePool's). An unset priority is 0.
func (w *objectiveWatcher) ofPool(u *unstructured.Unstructured) (int32, bool) {
	name, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "name")
	group, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "group")
	if name != w.pool || (group != "" && group != poolGVR.Group) || u.GetDeletionTimestamp() != nil {
		return 0, false
	}
	p, found, err := unstructured.NestedInt64(u.Object, "spec", "priority")
	if err != nil || !found {
		return 0, true
	}
	return int32(max(min(p, 1<<31-1), -1<<31)), true
}

// publish sets group i's objectives and the merged table, logging each
// objective whose priority changed.
func (w *objectiveWatcher) publish(i int, table map[string]int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.into.table.Load()
	w.byGroup[i] = table
	merged := map[string]int32{}
	for g := len(w.byGroup) - 1; g >= 0; g-- { // the first group wins
		maps.Copy(merged, w.byGroup[g])
	}
	var old map[string]int32
	if before != nil {
		old = *before
	}
	for name, p := range merged {
		if q, ok := old[name]; !ok || q != p {
			w.log.Info("inferenceobjective", "name", name, "priority", p)
		}
	}
	for name := range old {
		if _, ok := merged[name]; !ok {
			w.log.Info("inferenceobjective gone", "name", name)
		}
	}
	w.into.table.Store(&merged)
}
