package charts

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"

	"github.com/inferrail/inferrail/live/config"
)

// The release every test renders.
const (
	chartDir  = "inferrail"
	release   = "inferrail"
	namespace = "inference"
	// configPath is where both containers read the live configuration.
	configPath = "/etc/inferrail/live.yaml"
)

// loadChart loads charts/inferrail (tests run in charts/).
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	if err := ch.Validate(); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	// helm template checks kubeVersion against its default Kubernetes
	// version, which is v1.20 in a helm built without release ldflags.
	if kv := ch.Metadata.KubeVersion; kv != "" && !chartutil.IsCompatibleRange(kv, chartutil.DefaultCapabilities.KubeVersion.String()) {
		t.Fatalf("kubeVersion %q refuses %s: helm template would fail without --kube-version", kv, chartutil.DefaultCapabilities.KubeVersion)
	}
	if ch.Metadata.APIVersion != chart.APIVersionV2 || ch.Metadata.AppVersion == "" || ch.Schema == nil {
		t.Fatalf("Chart.yaml: apiVersion %q appVersion %q, schema loaded %v", ch.Metadata.APIVersion, ch.Metadata.AppVersion, ch.Schema != nil)
	}
	return ch
}

// object is one rendered manifest.
type object struct {
	source     string // the template it came from
	apiVersion string
	kind       string
	name       string
	namespace  string
	raw        []byte
}

func (o object) String() string { return o.kind + "/" + o.name + " (" + o.source + ")" }

// rendering is what one set of values renders to.
type rendering struct {
	chart   *chart.Chart
	values  chartutil.Values // .Values after coalescing
	objects []object
	notes   string

	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols         map[string]*networkingv1.NetworkPolicy
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	serviceMonitors map[string]*serviceMonitor
	inferencePools  map[string]*inferencePool
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart writes; decoding is strict, so a field the chart writes and this
// type lacks fails the test.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Authorization *struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// inferencePool is inference.networking.k8s.io/v1 InferencePool (the
// Gateway API Inference Extension's module is not served here).
type inferencePool struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int32 `json:"number"`
		} `json:"targetPorts"`
		EndpointPickerRef struct {
			Group *string `json:"group,omitempty"`
			Kind  string  `json:"kind,omitempty"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int32 `json:"number"`
			} `json:"port,omitempty"`
			FailureMode string `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

// check checks the fields the API server would require.
func (p *inferencePool) check() error {
	s := p.Spec
	switch {
	case p.APIVersion != "inference.networking.k8s.io/v1":
		return fmt.Errorf("apiVersion %q, want inference.networking.k8s.io/v1", p.APIVersion)
	case p.Metadata.Name == "":
		return fmt.Errorf("no metadata.name")
	case len(s.Selector.MatchLabels) == 0:
		return fmt.Errorf("spec.selector.matchLabels is empty: the pool would select no pods")
	case len(s.TargetPorts) == 0 || len(s.TargetPorts) > 8:
		return fmt.Errorf("spec.targetPorts: %d ports, want 1 to 8", len(s.TargetPorts))
	case s.EndpointPickerRef.Name == "":
		return fmt.Errorf("spec.endpointPickerRef.name is required")
	case s.EndpointPickerRef.Kind != "" && s.EndpointPickerRef.Kind != "Service":
		return fmt.Errorf("spec.endpointPickerRef.kind %q, want Service", s.EndpointPickerRef.Kind)
	case s.EndpointPickerRef.Port == nil:
		return fmt.Errorf("spec.endpointPickerRef.port is required for a Service")
	case s.EndpointPickerRef.FailureMode != "" && s.EndpointPickerRef.FailureMode != "FailOpen" && s.EndpointPickerRef.FailureMode != "FailClose":
		return fmt.Errorf("spec.endpointPickerRef.failureMode %q", s.EndpointPickerRef.FailureMode)
	}
	for _, tp := range s.TargetPorts {
		if tp.Number < 1 || tp.Number > 65535 {
			return fmt.Errorf("spec.targetPorts: %d", tp.Number)
		}
	}
	return nil
}

// readValues reads value files and applies overrides on top, as
// `helm template -f a.yaml -f b.yaml` would.
func readValues(t *testing.T, files []string, overrides ...map[string]any) map[string]any {
	t.Helper()
	vals := map[string]any{}
	for _, f := range files {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	for _, o := range overrides {
		vals = chartutil.CoalesceTables(deepCopy(o), vals)
	}
	return vals
}

func deepCopy(m map[string]any) map[string]any {
	b, err := yaml.Marshal(m)
	if err != nil {
		panic(err)
	}
	var out map[string]any
	if err := yaml.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// render renders the chart with vals, as `helm template` does, in-process.
func render(ch *chart.Chart, vals map[string]any) (*rendering, error) {
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, chartutil.DefaultCapabilities.Copy())
	if err != nil {
		return nil, fmt.Errorf("render values: %w", err)
	}
	// ToRenderValues validates; do it again on its own so the schema is
	// known to be in force even if that changes.
	top, _ := rv["Values"].(chartutil.Values)
	if err := chartutil.ValidateAgainstSchema(ch, top); err != nil {
		return nil, fmt.Errorf("values schema: %w", err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	r := &rendering{chart: ch, values: top}
	names := slices.Sorted(maps.Keys(out))
	for _, src := range names {
		text := out[src]
		if path.Base(src) == "NOTES.txt" {
			r.notes = text
			continue
		}
		if strings.HasPrefix(path.Base(src), "_") {
			continue
		}
		for _, doc := range splitDocuments(text) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				return nil, fmt.Errorf("%s: not YAML: %w\n%s", src, err, doc)
			}
			r.objects = append(r.objects, object{src, head.APIVersion, head.Kind, head.Metadata.Name, head.Metadata.Namespace, doc})
		}
	}
	return r, nil
}

// splitDocuments splits a YAML stream at its "---" lines and drops the
// documents that hold only comments and blank lines.
func splitDocuments(s string) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(s, -1) {
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// strict decodes an object into v, refusing unknown and duplicate fields.
func strict(o object, v any) error {
	if err := yaml.UnmarshalStrict(o.raw, v); err != nil {
		return fmt.Errorf("%s does not decode strictly into %T: %w", o, v, err)
	}
	return nil
}

// decode decodes every object strictly into its k8s.io/api type (or the
// local types of the two custom resources); an unknown kind fails.
func (r *rendering) decode(t *testing.T) {
	t.Helper()
	r.deployments = map[string]*appsv1.Deployment{}
	r.services = map[string]*corev1.Service{}
	r.configMaps = map[string]*corev1.ConfigMap{}
	r.secrets = map[string]*corev1.Secret{}
	r.serviceAccounts = map[string]*corev1.ServiceAccount{}
	r.pdbs = map[string]*policyv1.PodDisruptionBudget{}
	r.hpas = map[string]*autoscalingv2.HorizontalPodAutoscaler{}
	r.netpols = map[string]*networkingv1.NetworkPolicy{}
	r.roles = map[string]*rbacv1.Role{}
	r.roleBindings = map[string]*rbacv1.RoleBinding{}
	r.serviceMonitors = map[string]*serviceMonitor{}
	r.inferencePools = map[string]*inferencePool{}
	seen := map[string]bool{}
	for _, o := range r.objects {
		key := o.kind + "/" + o.namespace + "/" + o.name
		if seen[key] {
			t.Errorf("%s rendered twice", o)
		}
		seen[key] = true
		var err error
		switch o.apiVersion + " " + o.kind {
		case "apps/v1 Deployment":
			err = decodeInto(o, r.deployments)
		case "v1 Service":
			err = decodeInto(o, r.services)
		case "v1 ConfigMap":
			err = decodeInto(o, r.configMaps)
		case "v1 Secret":
			err = decodeInto(o, r.secrets)
		case "v1 ServiceAccount":
			err = decodeInto(o, r.serviceAccounts)
		case "policy/v1 PodDisruptionBudget":
			err = decodeInto(o, r.pdbs)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			err = decodeInto(o, r.hpas)
		case "networking.k8s.io/v1 NetworkPolicy":
			err = decodeInto(o, r.netpols)
		case "rbac.authorization.k8s.io/v1 Role":
			err = decodeInto(o, r.roles)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			err = decodeInto(o, r.roleBindings)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			err = decodeInto(o, r.serviceMonitors)
		case "inference.networking.k8s.io/v1 InferencePool":
			err = decodeInto(o, r.inferencePools)
			if err == nil {
				err = r.inferencePools[o.name].check()
			}
		default:
			err = fmt.Errorf("%s: unexpected apiVersion %q kind %q", o, o.apiVersion, o.kind)
		}
		if err != nil {
			t.Error(err)
		}
	}
}

func decodeInto[T any](o object, m map[string]*T) error {
	v := new(T)
	if err := strict(o, v); err != nil {
		return err
	}
	m[o.name] = v
	return nil
}

// kinds lists the rendered objects as Kind/name, sorted.
func (r *rendering) kinds() []string {
	var ks []string
	for _, o := range r.objects {
		ks = append(ks, o.kind+"/"+o.name)
	}
	sort.Strings(ks)
	return ks
}

// mustRender renders and decodes value files (relative to charts/) with
// overrides and checks the invariants every rendering must hold.
func mustRender(t *testing.T, files []string, overrides ...map[string]any) *rendering {
	t.Helper()
	r, err := render(loadChart(t), readValues(t, files, overrides...))
	if err != nil {
		t.Fatal(err)
	}
	r.decode(t)
	r.checkCommon(t)
	return r
}

// checkCommon checks what holds for every set of values.
func (r *rendering) checkCommon(t *testing.T) {
	t.Helper()
	wantLabels := map[string]string{
		"app.kubernetes.io/name":       "inferrail",
		"app.kubernetes.io/instance":   release,
		"app.kubernetes.io/version":    r.chart.Metadata.AppVersion,
		"app.kubernetes.io/managed-by": "Helm",
		"helm.sh/chart":                "inferrail-" + r.chart.Metadata.Version,
	}
	for _, o := range r.objects {
		if bytes.Contains(o.raw, []byte("<no value>")) {
			t.Errorf("%s holds <no value>: a template reads a value that is not set", o)
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(o.raw, &meta); err != nil {
			t.Fatal(err)
		}
		for k, v := range wantLabels {
			if got := meta.Metadata.Labels[k]; got != v {
				t.Errorf("%s: label %s = %q, want %q", o, k, got, v)
			}
		}
		for k, v := range meta.Metadata.Labels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				t.Errorf("%s: label key %q: %v", o, k, errs)
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("%s: label %s value %q: %v", o, k, v, errs)
			}
		}
		if o.namespace != namespace && o.kind != "Role" && o.kind != "RoleBinding" {
			t.Errorf("%s: namespace %q, want the release's %q", o, o.namespace, namespace)
		}
		if errs := validation.IsDNS1123Subdomain(o.name); len(errs) > 0 {
			t.Errorf("%s: name: %v", o, errs)
		}
		if o.kind == "Service" {
			if errs := validation.IsDNS1035Label(o.name); len(errs) > 0 {
				t.Errorf("%s: a Service name must be a DNS-1035 label: %v", o, errs)
			}
		}
	}
	for name, d := range r.deployments {
		r.checkDeployment(t, name, d)
	}
	for name, s := range r.services {
		r.checkService(t, name, s)
	}
	for name, p := range r.pdbs {
		if _, ok := r.selected(p.Spec.Selector); !ok {
			t.Errorf("PodDisruptionBudget/%s selects no Deployment's pods", name)
		}
		if (p.Spec.MaxUnavailable == nil) == (p.Spec.MinAvailable == nil) {
			t.Errorf("PodDisruptionBudget/%s: want exactly one of maxUnavailable and minAvailable", name)
		}
	}
	for name, sm := range r.serviceMonitors {
		r.checkServiceMonitor(t, name, sm)
	}
	for name, p := range r.netpols {
		r.checkNetworkPolicy(t, name, p)
	}
	for name, p := range r.inferencePools {
		ref := p.Spec.EndpointPickerRef
		svc, ok := r.services[ref.Name]
		if !ok {
			t.Errorf("InferencePool/%s: endpointPickerRef names Service %q, which is not rendered", name, ref.Name)
			continue
		}
		found := false
		for _, sp := range svc.Spec.Ports {
			if sp.Port == ref.Port.Number {
				found = true
				if sp.AppProtocol == nil || (*sp.AppProtocol != "http2" && *sp.AppProtocol != "kubernetes.io/h2c") {
					t.Errorf("InferencePool/%s: the picker's Service port %d has appProtocol %q, want http2 (TLS) or kubernetes.io/h2c", name, sp.Port, deref(sp.AppProtocol))
				}
			}
		}
		if !found {
			t.Errorf("InferencePool/%s: endpointPickerRef port %d is not a port of Service/%s", name, ref.Port.Number, ref.Name)
		}
	}
	for name, rb := range r.roleBindings {
		if _, ok := r.roles[rb.RoleRef.Name]; !ok || rb.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding/%s refers to %s/%s, which is not rendered", name, rb.RoleRef.Kind, rb.RoleRef.Name)
		}
		for _, s := range rb.Subjects {
			if _, ok := r.serviceAccounts[s.Name]; s.Kind == "ServiceAccount" && !ok && r.values["epp"].(map[string]any)["serviceAccount"].(map[string]any)["create"] == true {
				t.Errorf("RoleBinding/%s binds ServiceAccount %q, which is not rendered", name, s.Name)
			}
		}
	}
	if r.notes == "" || !strings.Contains(r.notes, "inferrail") {
		t.Errorf("NOTES.txt renders to %q", r.notes)
	}
	// Every Service NOTES.txt tells to port-forward to exists.
	for _, m := range regexp.MustCompile(`port-forward svc/(\S+)`).FindAllStringSubmatch(r.notes, -1) {
		if r.services[m[1]] == nil {
			t.Errorf("NOTES.txt port-forwards to svc/%s, which is not rendered", m[1])
		}
	}
}

// selected returns the Deployment whose pod template a selector selects.
func (r *rendering) selected(sel *metav1.LabelSelector) (*appsv1.Deployment, bool) {
	if sel == nil {
		return nil, false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil, false
	}
	var found *appsv1.Deployment
	for _, d := range r.deployments {
		if s.Matches(labels.Set(d.Spec.Template.Labels)) {
			if found != nil {
				return nil, false // two Deployments: the selector is too wide
			}
			found = d
		}
	}
	return found, found != nil
}

// checkNetworkPolicy: a policy selects exactly one Deployment's pods, is
// for ingress, and every port it admits is a named port of that pod's
// container, so the policy admits what the pod serves and nothing else.
func (r *rendering) checkNetworkPolicy(t *testing.T, name string, p *networkingv1.NetworkPolicy) {
	t.Helper()
	d, ok := r.selected(&p.Spec.PodSelector)
	if !ok {
		t.Errorf("NetworkPolicy/%s selects not exactly one Deployment's pods", name)
		return
	}
	if !slices.Equal(p.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("NetworkPolicy/%s: policyTypes %v, want Ingress", name, p.Spec.PolicyTypes)
	}
	served := map[string]bool{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, cp := range c.Ports {
			served[cp.Name] = true
		}
	}
	for _, rule := range p.Spec.Ingress {
		for _, pp := range rule.Ports {
			if pp.Port == nil || pp.Port.Type != intstr.String || !served[pp.Port.StrVal] {
				t.Errorf("NetworkPolicy/%s admits port %v, not a named port of %s's container", name, pp.Port, d.Name)
			}
		}
	}
}

func (r *rendering) checkService(t *testing.T, name string, s *corev1.Service) {
	t.Helper()
	d, ok := r.selected(&metav1.LabelSelector{MatchLabels: s.Spec.Selector})
	if !ok {
		t.Errorf("Service/%s: its selector %v selects not exactly one Deployment's pods", name, s.Spec.Selector)
		return
	}
	for _, p := range s.Spec.Ports {
		if p.TargetPort.Type != intstr.String {
			t.Errorf("Service/%s port %s: targetPort %v, want a container port's name", name, p.Name, p.TargetPort.String())
			continue
		}
		if containerPort(d.Spec.Template.Spec.Containers[0], p.TargetPort.StrVal) == 0 {
			t.Errorf("Service/%s port %s: targetPort %q is no port of Deployment/%s", name, p.Name, p.TargetPort.StrVal, d.Name)
		}
	}
}

func (r *rendering) checkServiceMonitor(t *testing.T, name string, sm *serviceMonitor) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("ServiceMonitor/%s: selector %v: %v", name, sm.Spec.Selector, err)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor/%s: namespaceSelector %v", name, sm.Spec.NamespaceSelector.MatchNames)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Fatalf("ServiceMonitor/%s has no endpoints", name)
	}
	for _, ep := range sm.Spec.Endpoints {
		targets := 0
		for sname, s := range r.services {
			if !sel.Matches(labels.Set(s.Labels)) {
				continue
			}
			for _, p := range s.Spec.Ports {
				if p.Name == ep.Port {
					targets++
					if p.TargetPort.StrVal != "admin" {
						t.Errorf("ServiceMonitor/%s scrapes Service/%s port %s, which is not the admin listener", name, sname, p.Name)
					}
				}
			}
		}
		if targets == 0 {
			t.Errorf("ServiceMonitor/%s: no selected Service has a port named %q", name, ep.Port)
		}
		if ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor/%s: path %q", name, ep.Path)
		}
		if ep.Authorization == nil || ep.Authorization.Type != "Bearer" {
			t.Errorf("ServiceMonitor/%s: no bearer authorization: /metrics needs the admin token", name)
			continue
		}
		c := ep.Authorization.Credentials
		if s, ok := r.secrets[c.Name]; !ok || len(s.Data[c.Key]) == 0 {
			t.Errorf("ServiceMonitor/%s: credentials %s/%s are not a rendered Secret's key", name, c.Name, c.Key)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return *s
}

// containerPort returns the number of a named port of c, 0 if none.
func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// portOf returns the port of a host:port listen address.
func portOf(t *testing.T, what, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	return int32(n)
}

// probePort resolves a probe's port (a name or a number) in c.
func probePort(c corev1.Container, p *corev1.Probe) int32 {
	if p == nil || p.HTTPGet == nil {
		return 0
	}
	if p.HTTPGet.Port.Type == intstr.Int {
		return p.HTTPGet.Port.IntVal
	}
	return containerPort(c, p.HTTPGet.Port.StrVal)
}

// liveConfig is a Deployment's live configuration and where it came from.
type liveConfig struct {
	configMap string
	text      string         // live.yaml as the ConfigMap holds it
	doc       map[string]any // parsed
	parsed    *config.Config // validated by live/config
}

// checkDeployment checks a gateway or picker Deployment against its own
// configuration.
func (r *rendering) checkDeployment(t *testing.T, name string, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Deployment/%s: selector %v does not select its own pods %v", name, d.Spec.Selector, d.Spec.Template.Labels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment/%s: %d containers, want 1", name, len(pod.Containers))
	}
	c := pod.Containers[0]
	component := d.Spec.Template.Labels["app.kubernetes.io/component"]
	wantArgs := map[string][]string{
		"gateway":         {"live", "--config", configPath},
		"endpoint-picker": {"epp", "--config", configPath},
	}[component]
	if wantArgs == nil {
		t.Fatalf("Deployment/%s: component label %q", name, component)
	}
	if len(c.Args) < 3 || !slices.Equal(c.Args[:3], wantArgs) {
		t.Errorf("Deployment/%s: args %q, want %q", name, c.Args, wantArgs)
	}
	if len(c.Command) != 0 {
		t.Errorf("Deployment/%s: command %q overrides the image's entrypoint", name, c.Command)
	}

	// The image: pinned, the appVersion unless told otherwise.
	r.checkImage(t, name, c.Image)
	for _, ic := range pod.InitContainers {
		if ic.Image != c.Image {
			t.Errorf("Deployment/%s: init container %s runs %s, not %s", name, ic.Name, ic.Image, c.Image)
		}
		if !slices.Equal(ic.Args, append(slices.Clone(wantArgs), "--check")) {
			t.Errorf("Deployment/%s: init container %s args %q", name, ic.Name, ic.Args)
		}
		checkSecurity(t, name+" init "+ic.Name, ic.SecurityContext, pod.SecurityContext)
		checkResources(t, name+" init "+ic.Name, ic.Resources)
	}

	checkResources(t, name, c.Resources)
	checkSecurity(t, name, c.SecurityContext, pod.SecurityContext)
	if component == "gateway" && (pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken) {
		t.Errorf("Deployment/%s: the gateway mounts a service account token it never uses", name)
	}

	lc := r.configOf(t, name, d)
	if lc == nil {
		return
	}
	// Ports: the container's are the configuration's.
	if component == "gateway" {
		if got, want := containerPort(c, "http"), portOf(t, "listen", lc.parsed.Listen); got != want {
			t.Errorf("Deployment/%s: container port http %d, but the config listens on %s", name, got, lc.parsed.Listen)
		}
	}
	adminPort := portOf(t, "admin_listen", lc.parsed.AdminListen)
	if got := containerPort(c, "admin"); got != adminPort {
		t.Errorf("Deployment/%s: container port admin %d, but admin_listen is %s", name, got, lc.parsed.AdminListen)
	}
	if component == "endpoint-picker" {
		want := toInt(r.values["epp"].(map[string]any)["port"])
		listen := lc.parsed.EPP.Listen
		if got := containerPort(c, "grpc"); int(got) != want || got != portOf(t, "epp.listen", listen) {
			t.Errorf("Deployment/%s: container port grpc %d, want epp.port %d and the config's epp.listen %s", name, got, want, listen)
		}
		if host, _, _ := net.SplitHostPort(listen); host == "localhost" || net.ParseIP(host) != nil && net.ParseIP(host).IsLoopback() {
			t.Errorf("Deployment/%s: epp.listen %s is a loopback address: Envoy could not reach the picker", name, listen)
		}
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/livez"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		switch {
		case p.probe == nil || p.probe.HTTPGet == nil:
			t.Errorf("Deployment/%s: no HTTP %s", name, p.what)
		case p.probe.HTTPGet.Path != p.path:
			t.Errorf("Deployment/%s: %s path %q, want %s", name, p.what, p.probe.HTTPGet.Path, p.path)
		case probePort(c, p.probe) != adminPort:
			t.Errorf("Deployment/%s: %s port %v is not the admin port %d", name, p.what, p.probe.HTTPGet.Port.String(), adminPort)
		}
	}

	// A configuration change rolls the pods.
	sum := sha256.Sum256([]byte(strings.TrimSuffix(lc.text, "\n")))
	if got := d.Spec.Template.Annotations["checksum/config"]; got != hex.EncodeToString(sum[:]) {
		t.Errorf("Deployment/%s: checksum/config %q is not the sha256 of ConfigMap/%s's live.yaml (%x)", name, got, lc.configMap, sum)
	}
}

func (r *rendering) checkImage(t *testing.T, name, image string) {
	t.Helper()
	img := r.values["image"].(map[string]any)
	repo, _ := img["repository"].(string)
	if digest, _ := img["digest"].(string); digest != "" {
		if image != repo+"@"+digest {
			t.Errorf("Deployment/%s: image %q, want %s@%s", name, image, repo, digest)
		}
		return
	}
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		t.Errorf("Deployment/%s: image %q has no tag", name, image)
		return
	}
	tag := image[i+1:]
	if tag == "latest" || tag == "" {
		t.Errorf("Deployment/%s: image %q is not pinned", name, image)
	}
	want, _ := img["tag"].(string)
	if want == "" {
		want = r.chart.Metadata.AppVersion
	}
	if image != repo+":"+want {
		t.Errorf("Deployment/%s: image %q, want %s:%s", name, image, repo, want)
	}
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case int64:
		return int(n)
	case float64:
		return int(n)
	case interface{ Int64() (int64, error) }:
		i, _ := n.Int64()
		return int(i)
	}
	panic(fmt.Sprintf("not a number: %T %v", v, v))
}

func checkResources(t *testing.T, name string, res corev1.ResourceRequirements) {
	t.Helper()
	for _, rn := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okr := res.Requests[rn]
		lim, okl := res.Limits[rn]
		if !okr || req.IsZero() {
			t.Errorf("%s: no %s request", name, rn)
		}
		if !okl || lim.IsZero() {
			t.Errorf("%s: no %s limit", name, rn)
		}
		if okr && okl && req.Cmp(lim) > 0 {
			t.Errorf("%s: %s request %s above its limit %s", name, rn, req.String(), lim.String())
		}
	}
}

func checkSecurity(t *testing.T, name string, sc *corev1.SecurityContext, psc *corev1.PodSecurityContext) {
	t.Helper()
	nonRoot := sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot ||
		psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if !nonRoot {
		t.Errorf("%s: runAsNonRoot is not set", name)
	}
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: the pod's runAsUser is not a non-root user", name)
	}
	switch {
	case sc == nil:
		t.Errorf("%s: no securityContext", name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: the root file system is writable", name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: privilege escalation allowed", name)
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities %+v, want drop ALL and add none", name, sc.Capabilities)
	}
}

// configOf finds the live configuration a Deployment's container reads,
// checks how it is mounted and validates it with live/config.
func (r *rendering) configOf(t *testing.T, name string, d *appsv1.Deployment) *liveConfig {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	mounts := map[string]corev1.VolumeMount{} // by volume name
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("Deployment/%s: mount %s names no volume", name, m.Name)
		}
	}
	if m, ok := mounts["tmp"]; !ok || m.MountPath != "/tmp" || vols["tmp"].EmptyDir == nil {
		t.Errorf("Deployment/%s: /tmp is not a writable emptyDir", name)
	}

	// The file each projected or plain volume puts where.
	files := map[string]string{} // path in the container -> "ConfigMap/NAME KEY" or "Secret/NAME KEY"
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		switch {
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				switch {
				case s.ConfigMap != nil:
					for _, it := range s.ConfigMap.Items {
						files[path.Join(m.MountPath, it.Path)] = "ConfigMap/" + s.ConfigMap.Name + " " + it.Key
					}
				case s.Secret != nil:
					for _, it := range s.Secret.Items {
						files[path.Join(m.MountPath, it.Path)] = "Secret/" + s.Secret.Name + " " + it.Key
					}
				}
			}
		case v.ConfigMap != nil:
			for _, it := range v.ConfigMap.Items {
				files[path.Join(m.MountPath, it.Path)] = "ConfigMap/" + v.ConfigMap.Name + " " + it.Key
			}
		}
	}
	src, ok := files[configPath]
	if !ok {
		t.Errorf("Deployment/%s: nothing is mounted at %s (mounted: %v)", name, configPath, slices.Sorted(maps.Keys(files)))
		return nil
	}
	ref, key, _ := strings.Cut(src, " ")
	cmName, isCM := strings.CutPrefix(ref, "ConfigMap/")
	cm, found := r.configMaps[cmName]
	if !isCM || !found || key != "live.yaml" {
		t.Errorf("Deployment/%s: %s comes from %s, not a rendered ConfigMap's live.yaml", name, configPath, src)
		return nil
	}
	lc := &liveConfig{configMap: cmName, text: cm.Data["live.yaml"]}
	if err := yaml.Unmarshal([]byte(lc.text), &lc.doc); err != nil {
		t.Errorf("ConfigMap/%s: live.yaml is not YAML: %v", cmName, err)
		return nil
	}

	// Validate it as live would, with what only exists in the pod
	// replaced by local stand-ins: the admin token (it must be mounted
	// from a Secret), tokenizer directories (they must be under a
	// mounted volume). DNS names are not resolved by validation.
	doc := deepCopy(lc.doc)
	tmp := t.TempDir()
	if tf, _ := doc["admin_token_file"].(string); tf != "" {
		src, ok := files[tf]
		if !ok {
			t.Errorf("Deployment/%s: admin_token_file %s is not mounted", name, tf)
		} else if sname, isSecret := strings.CutPrefix(strings.Fields(src)[0], "Secret/"); !isSecret {
			t.Errorf("Deployment/%s: admin_token_file %s comes from %s, not a Secret", name, tf, src)
		} else if s, ok := r.secrets[sname]; ok {
			if tok := strings.TrimSpace(string(s.Data[strings.Fields(src)[1]])); len(tok) < 16 {
				t.Errorf("Secret/%s: token of %d characters, live wants at least 16", sname, len(tok))
			}
		}
		local := filepath.Join(tmp, "admin-token")
		if err := os.WriteFile(local, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		doc["admin_token_file"] = local
	}
	models, _ := doc["models"].([]any)
	for i, m := range models {
		mm, _ := m.(map[string]any)
		tok, _ := mm["tokenizer"].(string)
		if tok == "" || strings.HasPrefix(tok, "builtin:") {
			continue
		}
		under := false
		for _, vm := range c.VolumeMounts {
			if vm.Name != "config" && vm.Name != "tmp" && (tok == vm.MountPath || strings.HasPrefix(tok, strings.TrimSuffix(vm.MountPath, "/")+"/")) {
				under = true
			}
		}
		if !under {
			t.Errorf("Deployment/%s: models[%d].tokenizer %s is under no mounted volume", name, i, tok)
			continue
		}
		dir := filepath.Join(tmp, "tokenizer-"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		mm["tokenizer"] = dir
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	lc.parsed, err = config.Parse(b)
	if err != nil {
		t.Errorf("ConfigMap/%s: live/config rejects live.yaml:\n%v\n---\n%s", cmName, err, b)
		return nil
	}
	return lc
}

// eppPool returns the pool the picker Deployment's configuration names.
func (r *rendering) eppPool(t *testing.T, deployment string) (name, ns string) {
	t.Helper()
	d := r.deployments[deployment]
	if d == nil {
		t.Fatalf("no Deployment/%s", deployment)
	}
	lc := r.configOf(t, deployment, d)
	if lc == nil {
		t.FailNow()
	}
	return lc.parsed.EPP.Pool.Name, lc.parsed.EPP.Pool.Namespace
}

// TestDefault renders the chart's own values.
func TestDefault(t *testing.T) {
	r := mustRender(t, []string{"testdata/values-default.yaml"})
	want := []string{
		"ConfigMap/inferrail",
		"Deployment/inferrail",
		"PodDisruptionBudget/inferrail", // replicaCount 2
		"Secret/inferrail-admin-token",
		"Service/inferrail",
		"Service/inferrail-metrics",
	}
	if got := r.kinds(); !slices.Equal(got, want) {
		t.Errorf("rendered %v, want %v", got, want)
	}
	d := r.deployments["inferrail"]
	if d == nil {
		t.Fatal("no gateway Deployment")
	}
	if got, want := d.Spec.Template.Spec.Containers[0].Image, "inferrail:"+r.chart.Metadata.AppVersion; got != want {
		t.Errorf("image %q, want %q (the chart's appVersion)", got, want)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d", *d.Spec.Replicas)
	}
	// The default fleet: the engines' headless Service, by DNS.
	lc := r.configOf(t, "inferrail", d)
	if lc == nil {
		t.FailNow()
	}
	m := lc.parsed.Models[0]
	if len(m.DNS) != 1 || m.DNS[0].Host != "vllm-llama.default.svc.cluster.local" || m.DNS[0].Port != 8000 {
		t.Errorf("default engines %+v, want the DNS group vllm-llama.default.svc.cluster.local:8000", m.DNS)
	}
	if lc.parsed.AdminTokenFile == "" {
		t.Error("admin_token_file not set: live refuses an admin listener on the pod's address without it")
	}
	if s := r.services["inferrail"]; s.Spec.Ports[0].Port != 80 {
		t.Errorf("client Service port %d, want 80", s.Spec.Ports[0].Port)
	}
	if !strings.Contains(r.notes, "port-forward svc/inferrail ") {
		t.Errorf("NOTES.txt does not say how to reach the gateway:\n%s", r.notes)
	}
	for _, o := range r.objects {
		if strings.Contains(o.name, "epp") || o.kind == "InferencePool" || o.kind == "ServiceMonitor" {
			t.Errorf("%s rendered by default", o)
		}
	}
}

// TestEPP renders the endpoint picker beside the gateway, with the
// InferencePool the chart creates.
func TestEPP(t *testing.T) {
	r := mustRender(t, []string{"testdata/values-epp.yaml"})
	for _, k := range []string{
		"ConfigMap/inferrail-epp", "Deployment/inferrail-epp", "Service/inferrail-epp",
		"ServiceAccount/inferrail-epp", "Role/inferrail-epp", "RoleBinding/inferrail-epp",
		"InferencePool/inferrail", "Deployment/inferrail", "Service/inferrail",
	} {
		if !slices.Contains(r.kinds(), k) {
			t.Errorf("%s not rendered; have %v", k, r.kinds())
		}
	}
	d := r.deployments["inferrail-epp"]
	if d == nil {
		t.FailNow()
	}
	if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "inferrail-epp" {
		t.Errorf("picker runs as ServiceAccount %q", sa)
	}
	// ext_proc over TLS by default (the picker's secure_serving), the
	// Service saying http2; h2c when secureServing is off.
	grpcPort := func(r *rendering) string {
		t.Helper()
		for _, p := range r.services["inferrail-epp"].Spec.Ports {
			if p.Name == "grpc" {
				if p.Port != 9002 {
					t.Errorf("picker Service grpc port %d, want 9002", p.Port)
				}
				return deref(p.AppProtocol)
			}
		}
		t.Error("the picker's Service has no grpc port")
		return ""
	}
	secure := func(r *rendering) any {
		var c map[string]any
		if err := yaml.Unmarshal([]byte(r.configMaps["inferrail-epp"].Data["live.yaml"]), &c); err != nil {
			t.Fatal(err)
		}
		return c["epp"].(map[string]any)["secure_serving"]
	}
	if ap, ss := grpcPort(r), secure(r); ap != "http2" || ss != true {
		t.Errorf("by default the picker's Service says %q and its config secure_serving %v; want http2 and true", ap, ss)
	}
	plain := mustRender(t, []string{"testdata/values-epp.yaml"}, map[string]any{"epp": map[string]any{"secureServing": false}})
	if ap, ss := grpcPort(plain), secure(plain); ap != "kubernetes.io/h2c" || ss != false {
		t.Errorf("with secureServing false the picker's Service says %q and its config secure_serving %v; want kubernetes.io/h2c and false", ap, ss)
	}

	// RBAC: read pods, InferencePools and InferenceObjectives (in the
	// groups the picker watches), nothing else.
	role := r.roles["inferrail-epp"]
	rw := []string{"get", "list", "watch"}
	want := map[string][]string{"/pods": rw, "inference.networking.k8s.io/inferencepools": rw,
		"llm-d.ai/inferenceobjectives": rw, "inference.networking.x-k8s.io/inferenceobjectives": rw}
	got := map[string][]string{}
	for _, rule := range role.Rules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				got[g+"/"+res] = rule.Verbs
			}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Role rules %v, want %v", got, want)
	}
	rb := r.roleBindings["inferrail-epp"]
	if len(rb.Subjects) != 1 || rb.Subjects[0].Name != d.Spec.Template.Spec.ServiceAccountName || rb.Subjects[0].Namespace != namespace {
		t.Errorf("RoleBinding subjects %+v do not name the picker's ServiceAccount", rb.Subjects)
	}

	// Several pickers with leader election: the config says so, each pod
	// is named in the Lease by its name, and the Role may hold a Lease.
	ha := mustRender(t, []string{"testdata/values-epp.yaml"}, map[string]any{"epp": map[string]any{"replicaCount": 3, "leaderElection": map[string]any{"enabled": true}}})
	var hc map[string]any
	if err := yaml.Unmarshal([]byte(ha.configMaps["inferrail-epp"].Data["live.yaml"]), &hc); err != nil {
		t.Fatal(err)
	}
	if le := hc["epp"].(map[string]any)["leader_election"]; le.(map[string]any)["enabled"] != true || *ha.deployments["inferrail-epp"].Spec.Replicas != 3 {
		t.Errorf("leader_election %v, %d replicas", le, *ha.deployments["inferrail-epp"].Spec.Replicas)
	}
	podName := false
	for _, e := range ha.deployments["inferrail-epp"].Spec.Template.Spec.Containers[0].Env {
		podName = podName || e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}
	leases := false
	for _, rule := range ha.roles["inferrail-epp"].Rules {
		leases = leases || slices.Equal(rule.APIGroups, []string{"coordination.k8s.io"}) && slices.Equal(rule.Resources, []string{"leases"}) && slices.Equal(rule.Verbs, []string{"get", "create", "update"})
	}
	if !podName || !leases {
		t.Errorf("with leader election: POD_NAME set %v, the Role may hold leases %v", podName, leases)
	}

	// The pool: the picker watches the one the chart creates, which names
	// the picker as its endpoint picker and selects the engines.
	pool := r.inferencePools["inferrail"]
	if name, ns := r.eppPool(t, "inferrail-epp"); name != pool.Metadata.Name || ns != pool.Metadata.Namespace {
		t.Errorf("the picker watches %s/%s, the chart creates %s/%s", ns, name, pool.Metadata.Namespace, pool.Metadata.Name)
	}
	if pool.Spec.EndpointPickerRef.Name != "inferrail-epp" || pool.Spec.EndpointPickerRef.FailureMode != "FailClose" {
		t.Errorf("endpointPickerRef %+v", pool.Spec.EndpointPickerRef)
	}
	if !maps.Equal(pool.Spec.Selector.MatchLabels, map[string]string{"app": "vllm-llama"}) || pool.Spec.TargetPorts[0].Number != 8000 {
		t.Errorf("pool selects %v port %v", pool.Spec.Selector.MatchLabels, pool.Spec.TargetPorts)
	}
	// llm-d's central KV events: the picker binds the port, its Service
	// exposes it for the engine pods' publishers.
	central := mustRender(t, []string{"testdata/values-epp.yaml"}, map[string]any{"epp": map[string]any{"kvEventsPort": 5557}})
	var cc map[string]any
	if err := yaml.Unmarshal([]byte(central.configMaps["inferrail-epp"].Data["live.yaml"]), &cc); err != nil {
		t.Fatal(err)
	}
	if l := cc["epp"].(map[string]any)["pool"].(map[string]any)["kv_events_listen"]; l != "tcp://*:5557" {
		t.Errorf("kvEventsPort 5557: kv_events_listen %v", l)
	}
	exposed := false
	for _, p := range central.services["inferrail-epp"].Spec.Ports {
		exposed = exposed || p.Name == "kv-events" && p.Port == 5557
	}
	container := false
	for _, p := range central.deployments["inferrail-epp"].Spec.Template.Spec.Containers[0].Ports {
		container = container || p.Name == "kv-events" && p.ContainerPort == 5557
	}
	if !exposed || !container {
		t.Errorf("kvEventsPort 5557: Service port %v, container port %v", exposed, container)
	}
	// The gateway's configuration has no epp section.
	if strings.Contains(r.configMaps["inferrail"].Data["live.yaml"], "epp:") {
		t.Error("the gateway's live.yaml holds the picker's epp section")
	}
}

// TestServiceMonitor renders the ServiceMonitor, with and without the
// picker.
func TestServiceMonitor(t *testing.T) {
	r := mustRender(t, []string{"testdata/values-servicemonitor.yaml"})
	sm := r.serviceMonitors["inferrail"]
	if sm == nil {
		t.Fatalf("no ServiceMonitor; have %v", r.kinds())
	}
	if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Metadata.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor %s labels %v", sm.APIVersion, sm.Metadata.Labels)
	}
	if ep := sm.Spec.Endpoints[0]; ep.Interval != "30s" || ep.ScrapeTimeout != "10s" {
		t.Errorf("interval %q timeout %q", ep.Interval, ep.ScrapeTimeout)
	}
	// With the picker, the same ServiceMonitor scrapes both.
	mustRender(t, []string{"testdata/values-servicemonitor.yaml", "testdata/values-epp.yaml"})
}

// TestHA renders three gateways with a PodDisruptionBudget.
func TestHA(t *testing.T) {
	r := mustRender(t, []string{"testdata/values-ha.yaml"})
	d := r.deployments["inferrail"]
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas %d, want 3", *d.Spec.Replicas)
	}
	pdb := r.pdbs["inferrail"]
	if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("PodDisruptionBudget %+v, want maxUnavailable 1", pdb)
	}
	if len(d.Spec.Template.Spec.TopologySpreadConstraints) != 1 {
		t.Error("topologySpreadConstraints not passed through")
	}
	if got := d.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().String(); got != "2Gi" {
		t.Errorf("memory limit %s, want 2Gi", got)
	}

	// One replica: no budget unless asked for; minAvailable instead.
	one := mustRender(t, nil, map[string]any{"replicaCount": 1})
	if len(one.pdbs) != 0 {
		t.Error("a PodDisruptionBudget for one replica (it would block every drain)")
	}
	forced := mustRender(t, nil, map[string]any{"replicaCount": 1, "podDisruptionBudget": map[string]any{"enabled": true, "minAvailable": "50%"}})
	if p := forced.pdbs["inferrail"]; p == nil || p.Spec.MinAvailable == nil || p.Spec.MinAvailable.String() != "50%" || p.Spec.MaxUnavailable != nil {
		t.Errorf("podDisruptionBudget.enabled with minAvailable 50%%: %+v", p)
	}
}

// TestAutoscaling: with autoscaling.enabled a HorizontalPodAutoscaler
// scales the gateway's Deployment on CPU, the Deployment leaves its replica
// count to it (a rollout or an upgrade would otherwise reset what the
// autoscaler chose), and the PodDisruptionBudget follows minReplicas.
func TestAutoscaling(t *testing.T) {
	if r := mustRender(t, nil); len(r.hpas) != 0 {
		t.Errorf("a HorizontalPodAutoscaler by default: %v", r.kinds())
	}
	r := mustRender(t, nil, map[string]any{"autoscaling": map[string]any{
		"enabled": true, "minReplicas": 3, "maxReplicas": 12, "targetCPUUtilizationPercentage": 60,
		"behavior": map[string]any{"scaleDown": map[string]any{"stabilizationWindowSeconds": 600}},
	}})
	h := r.hpas["inferrail"]
	if h == nil {
		t.Fatalf("no HorizontalPodAutoscaler: %v", r.kinds())
	}
	ref := h.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || r.deployments[ref.Name] == nil || ref.Name != "inferrail" {
		t.Errorf("scaleTargetRef %+v, want the gateway's Deployment", ref)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas != 3 || h.Spec.MaxReplicas != 12 {
		t.Errorf("replicas %v to %d, want 3 to 12", h.Spec.MinReplicas, h.Spec.MaxReplicas)
	}
	if len(h.Spec.Metrics) != 1 {
		t.Fatalf("metrics %+v, want CPU only", h.Spec.Metrics)
	}
	m := h.Spec.Metrics[0]
	if m.Type != autoscalingv2.ResourceMetricSourceType || m.Resource == nil || m.Resource.Name != corev1.ResourceCPU ||
		m.Resource.Target.Type != autoscalingv2.UtilizationMetricType || m.Resource.Target.AverageUtilization == nil || *m.Resource.Target.AverageUtilization != 60 {
		t.Errorf("metric %+v, want CPU at 60%% of requests", m)
	}
	if b := h.Spec.Behavior; b == nil || b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil || *b.ScaleDown.StabilizationWindowSeconds != 600 {
		t.Errorf("behavior %+v, want scaleDown's window of 600 s", b)
	}
	if d := r.deployments["inferrail"]; d.Spec.Replicas != nil {
		t.Errorf("the Deployment sets replicas (%d) beside the autoscaler", *d.Spec.Replicas)
	}
	if r.pdbs["inferrail"] == nil {
		t.Error("no PodDisruptionBudget with minReplicas 3")
	}
	if !strings.Contains(r.notes, "3 to 12 replicas") {
		t.Errorf("NOTES.txt does not give the range:\n%s", r.notes)
	}
	// minReplicas 1: no budget (it would block every drain), and
	// replicaCount has no say.
	one := mustRender(t, nil, map[string]any{"replicaCount": 5, "autoscaling": map[string]any{"enabled": true, "minReplicas": 1}})
	if len(one.pdbs) != 0 {
		t.Error("a PodDisruptionBudget with minReplicas 1")
	}
	if h := one.hpas["inferrail"]; h == nil || h.Spec.Behavior != nil || *h.Spec.MinReplicas != 1 || h.Spec.MaxReplicas != 8 {
		t.Errorf("defaults beside minReplicas 1: %+v", h)
	}
	// The picker alone: nothing to scale.
	if r := mustRender(t, nil, map[string]any{"proxy": map[string]any{"enabled": false}, "epp": map[string]any{"enabled": true}, "autoscaling": map[string]any{"enabled": true}}); len(r.hpas) != 0 {
		t.Error("a HorizontalPodAutoscaler without the gateway")
	}
}

// TestNetworkPolicy: with networkPolicy.enabled each Deployment's pods
// admit traffic to their own ports only, each from its own peers (none
// listed: anyone).
func TestNetworkPolicy(t *testing.T) {
	if r := mustRender(t, nil, map[string]any{"epp": map[string]any{"enabled": true}}); len(r.netpols) != 0 {
		t.Errorf("a NetworkPolicy by default: %v", r.kinds())
	}
	// ports lists a policy's rules as port: peers.
	ports := func(p *networkingv1.NetworkPolicy) map[string][]networkingv1.NetworkPolicyPeer {
		m := map[string][]networkingv1.NetworkPolicyPeer{}
		for _, rule := range p.Spec.Ingress {
			for _, pp := range rule.Ports {
				m[pp.Port.String()] = rule.From
			}
		}
		return m
	}
	open := mustRender(t, nil, map[string]any{"networkPolicy": map[string]any{"enabled": true}})
	gw := open.netpols["inferrail"]
	if gw == nil || len(open.netpols) != 1 {
		t.Fatalf("NetworkPolicies %v, want the gateway's", open.kinds())
	}
	if got := ports(gw); len(got) != 2 || got["http"] != nil || got["admin"] != nil || len(gw.Spec.Ingress) != 2 {
		t.Errorf("gateway's rules %v, want http and admin from anyone", got)
	}

	monitoring := map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}
	r := mustRender(t, nil, map[string]any{
		"epp": map[string]any{"enabled": true, "kvEventsPort": 5557, "inferencePool": map[string]any{"create": true}},
		"networkPolicy": map[string]any{
			"enabled":      true,
			"clientFrom":   []any{map[string]any{"ipBlock": map[string]any{"cidr": "10.0.0.0/8", "except": []any{"10.9.0.0/16"}}}},
			"adminFrom":    []any{monitoring},
			"eppFrom":      []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"gateway.networking.k8s.io/gateway-name": "inference"}}}},
			"kvEventsFrom": []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "vllm-llama"}}}},
		},
	})
	gw, picker := r.netpols["inferrail"], r.netpols["inferrail-epp"]
	if gw == nil || picker == nil {
		t.Fatalf("NetworkPolicies %v, want the gateway's and the picker's", r.kinds())
	}
	g := ports(gw)
	if len(g["http"]) != 1 || g["http"][0].IPBlock == nil || g["http"][0].IPBlock.CIDR != "10.0.0.0/8" || !slices.Equal(g["http"][0].IPBlock.Except, []string{"10.9.0.0/16"}) {
		t.Errorf("gateway's http from %+v, want clientFrom", g["http"])
	}
	for _, rules := range []map[string][]networkingv1.NetworkPolicyPeer{g, ports(picker)} {
		if a := rules["admin"]; len(a) != 1 || a[0].NamespaceSelector == nil || a[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
			t.Errorf("admin from %+v, want adminFrom", a)
		}
	}
	p := ports(picker)
	if len(p) != 3 {
		t.Errorf("picker's rules %v, want grpc, kv-events and admin", p)
	}
	if e := p["grpc"]; len(e) != 1 || e[0].PodSelector == nil || e[0].PodSelector.MatchLabels["gateway.networking.k8s.io/gateway-name"] != "inference" {
		t.Errorf("picker's grpc from %+v, want eppFrom", e)
	}
	if k := p["kv-events"]; len(k) != 1 || k[0].PodSelector == nil || k[0].PodSelector.MatchLabels["app"] != "vllm-llama" {
		t.Errorf("picker's kv-events from %+v, want kvEventsFrom", k)
	}
	// Without central KV events the picker has no such port to admit.
	if p := ports(mustRender(t, nil, map[string]any{"epp": map[string]any{"enabled": true}, "networkPolicy": map[string]any{"enabled": true}}).netpols["inferrail-epp"]); len(p) != 2 || p["kv-events"] != nil {
		t.Errorf("picker's rules %v without epp.kvEventsPort, want grpc and admin", p)
	}
}

// TestChecksum: the checksum annotation follows the configuration, and
// only it.
func TestChecksum(t *testing.T) {
	sum := func(r *rendering) string {
		return r.deployments["inferrail"].Spec.Template.Annotations["checksum/config"]
	}
	a := sum(mustRender(t, nil))
	b := sum(mustRender(t, nil))
	c := sum(mustRender(t, nil, map[string]any{"config": map[string]any{"log": map[string]any{"level": "debug"}}}))
	d := sum(mustRender(t, nil, map[string]any{"replicaCount": 5}))
	if a == "" || a != b {
		t.Errorf("the same values gave checksums %q and %q", a, b)
	}
	if a == c {
		t.Error("a configuration change left the checksum as it was: the pods would not roll")
	}
	if a != d {
		t.Error("a change outside the configuration changed the checksum")
	}
}

// TestOverrides renders the values operators change most.
func TestOverrides(t *testing.T) {
	r := mustRender(t, nil, map[string]any{
		"image":   map[string]any{"repository": "example/inferrail", "tag": "1.2.3"},
		"service": map[string]any{"port": 8080, "type": "LoadBalancer"},
		"config":  map[string]any{"listen": "0.0.0.0:8000", "admin_listen": "[::]:9100"},
		"adminToken": map[string]any{
			"existingSecret": "my-token", "key": "bearer", "create": true,
		},
	})
	d := r.deployments["inferrail"]
	if got := d.Spec.Template.Spec.Containers[0].Image; got != "example/inferrail:1.2.3" {
		t.Errorf("image %q", got)
	}
	if len(r.secrets) != 0 {
		t.Errorf("a Secret rendered beside adminToken.existingSecret: %v", slices.Collect(maps.Keys(r.secrets)))
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	r = mustRender(t, nil, map[string]any{"image": map[string]any{"digest": digest}})
	if got := r.deployments["inferrail"].Spec.Template.Spec.Containers[0].Image; got != "inferrail@"+digest {
		t.Errorf("image %q, want the digest", got)
	}
}

// TestBadValues: a value of the wrong type, an unknown key or a value the
// gateway could not run with fails rendering with an error naming it.
func TestBadValues(t *testing.T) {
	ch := loadChart(t)
	for _, c := range []struct {
		name string
		vals map[string]any
		want []string
	}{
		{"replicaCount string", map[string]any{"replicaCount": "three"}, []string{"replicaCount", "want integer"}},
		{"resources string", map[string]any{"resources": "lots"}, []string{"/resources", "want object"}},
		{"resource quantity", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "a lot"}}}, []string{"/resources/limits/memory"}},
		{"typo at the top", map[string]any{"replicaCont": 3}, []string{"replicaCont"}},
		{"typo below", map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enable": true}}}, []string{"/metrics/serviceMonitor", "enable"}},
		{"service port string", map[string]any{"service": map[string]any{"port": "http"}}, []string{"/service/port"}},
		{"latest tag", map[string]any{"image": map[string]any{"tag": "latest"}}, []string{"image.tag", `"latest" is not allowed`}},
		{"bad failure mode", map[string]any{"epp": map[string]any{"inferencePool": map[string]any{"failureMode": "Maybe"}}}, []string{"/epp/inferencePool/failureMode"}},
		{"no models", map[string]any{"config": map[string]any{"models": []any{}}}, []string{"/config/models"}},
		{"loopback listen", map[string]any{"config": map[string]any{"listen": "127.0.0.1:8080"}}, []string{"config.listen", "loopback"}},
		{"no admin port", map[string]any{"config": map[string]any{"admin_listen": "localhost"}}, []string{"config.admin_listen"}},
		{"no admin token", map[string]any{"adminToken": map[string]any{"create": false}}, []string{"adminToken", "admin_token_file"}},
		{"own admin token file", map[string]any{"config": map[string]any{"admin_token_file": "/x"}}, []string{"config.admin_token_file"}},
		{"two pickers", map[string]any{"epp": map[string]any{"enabled": true, "replicaCount": 2}}, []string{"epp.replicaCount 2", "epp.leaderElection.enabled"}},
		{"own epp leader_election", map[string]any{"epp": map[string]any{"enabled": true}, "config": map[string]any{"epp": map[string]any{"leader_election": map[string]any{"enabled": true}}}}, []string{"config.epp.leader_election.enabled", "epp.leaderElection.enabled"}},
		{"own epp listen", map[string]any{"epp": map[string]any{"enabled": true}, "config": map[string]any{"epp": map[string]any{"listen": "127.0.0.1:9002"}}}, []string{"config.epp.listen", "epp.port"}},
		{"own epp secure_serving", map[string]any{"epp": map[string]any{"enabled": true}, "config": map[string]any{"epp": map[string]any{"secure_serving": false}}}, []string{"config.epp.secure_serving", "epp.secureServing"}},
		{"central kv events, two pickers", map[string]any{"epp": map[string]any{"enabled": true, "kvEventsPort": 5557, "replicaCount": 2, "leaderElection": map[string]any{"enabled": true}, "inferencePool": map[string]any{"create": true}}}, []string{"epp.kvEventsPort", "one picker only"}},
		{"central kv events, no pool", map[string]any{"epp": map[string]any{"enabled": true, "kvEventsPort": 5557}}, []string{"epp.kvEventsPort", "epp.pool.name"}},
		{"autoscaling max below min", map[string]any{"autoscaling": map[string]any{"enabled": true, "minReplicas": 4, "maxReplicas": 2}}, []string{"autoscaling.maxReplicas (2)", "autoscaling.minReplicas (4)"}},
		{"autoscaling without cpu requests", map[string]any{"autoscaling": map[string]any{"enabled": true}, "resources": map[string]any{"requests": map[string]any{"cpu": nil}}}, []string{"resources.requests.cpu"}},
		{"autoscaling zero replicas", map[string]any{"autoscaling": map[string]any{"minReplicas": 0}}, []string{"/autoscaling/minReplicas"}},
		{"autoscaling typo", map[string]any{"autoscaling": map[string]any{"targetCPU": 50}}, []string{"/autoscaling", "targetCPU"}},
		{"network policy peer typo", map[string]any{"networkPolicy": map[string]any{"enabled": true, "adminFrom": []any{map[string]any{"namespaceSelectr": map[string]any{}}}}}, []string{"/networkPolicy/adminFrom/0", "namespaceSelectr"}},
		{"network policy peers not a list", map[string]any{"networkPolicy": map[string]any{"clientFrom": "10.0.0.0/8"}}, []string{"/networkPolicy/clientFrom", "want array"}},
		{"pool mismatch", map[string]any{"epp": map[string]any{"enabled": true, "pool": map[string]any{"name": "other"}, "inferencePool": map[string]any{"create": true}}}, []string{"epp.pool.name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(ch, readValues(t, nil, c.vals))
			if err == nil {
				t.Fatal("rendered")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestExamples decodes examples/k8s strictly (so the examples cannot rot)
// and renders the chart with its values files.
func TestExamples(t *testing.T) {
	dir := filepath.Join("..", "examples", "k8s")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in %s: %v", dir, err)
	}
	ex := &rendering{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
	}
	pvcs := map[string]*corev1.PersistentVolumeClaim{}
	pools := map[string]*inferencePool{}
	gateways := map[string]*gatewayObj{}
	routes := map[string]*httpRoute{}
	renders := map[string]*rendering{}
	for _, f := range files {
		base := filepath.Base(f)
		if strings.Contains(base, "values") {
			renders[base] = mustRender(t, []string{f})
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocuments(string(b)) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct{ Name, Namespace string }
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			o := object{base, head.APIVersion, head.Kind, head.Metadata.Name, head.Metadata.Namespace, doc}
			var err error
			switch head.APIVersion + " " + head.Kind {
			case "apps/v1 Deployment":
				err = decodeInto(o, ex.deployments)
			case "v1 Service":
				err = decodeInto(o, ex.services)
			case "v1 PersistentVolumeClaim":
				err = decodeInto(o, pvcs)
			case "v1 ConfigMap":
				err = decodeInto(o, ex.configMaps)
			case "v1 Secret":
				err = decodeInto(o, ex.secrets)
			case "inference.networking.k8s.io/v1 InferencePool":
				if err = decodeInto(o, pools); err == nil {
					err = pools[o.name].check()
				}
			case "gateway.networking.k8s.io/v1 Gateway":
				err = decodeInto(o, gateways)
			case "gateway.networking.k8s.io/v1 HTTPRoute":
				err = decodeInto(o, routes)
			default:
				err = fmt.Errorf("%s: unexpected apiVersion %q kind %q", o, head.APIVersion, head.Kind)
			}
			if err != nil {
				t.Error(err)
			}
			if head.Metadata.Namespace != "" && head.Metadata.Namespace != "default" {
				t.Errorf("%s: namespace %q; the examples live in default (the values' DNS names say so)", o, head.Metadata.Namespace)
			}
		}
	}
	for _, want := range []string{"inferrail-values.yaml", "inferrail-epp-values.yaml"} {
		if renders[want] == nil {
			t.Errorf("examples/k8s/%s is missing", want)
		}
	}

	// The engines.
	vllm := ex.deployments["vllm-llama"]
	if vllm == nil {
		t.Fatalf("no vllm-llama Deployment in the examples; have %v", slices.Collect(maps.Keys(ex.deployments)))
	}
	c := vllm.Spec.Template.Spec.Containers[0]
	if i := strings.LastIndex(c.Image, ":"); !strings.HasPrefix(c.Image, "vllm/vllm-openai:") || i < 0 || !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(c.Image[i+1:]) {
		t.Errorf("vLLM image %q is not pinned to a release (vllm/vllm-openai:vX.Y.Z)", c.Image)
	}
	args := strings.Join(append(slices.Clone(c.Command), c.Args...), " ")
	for _, a := range []string{"--enable-prefix-caching", "--kv-events-config", "--served-model-name"} {
		if !strings.Contains(args, a) {
			t.Errorf("vLLM args lack %s: %s", a, args)
		}
	}
	if gpu := c.Resources.Limits["nvidia.com/gpu"]; gpu.IsZero() {
		t.Error("vLLM asks for no GPU")
	}
	enginePort := containerPort(c, "http")
	if !strings.Contains(args, fmt.Sprintf("--port %d", enginePort)) {
		t.Errorf("vLLM listens elsewhere than its container port http %d: %s", enginePort, args)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || probePort(c, p) != enginePort {
			t.Errorf("vLLM probe %+v, want GET /health on port %d", p, enginePort)
		}
	}
	for _, v := range vllm.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && pvcs[v.PersistentVolumeClaim.ClaimName] == nil {
			t.Errorf("vLLM mounts PersistentVolumeClaim %s, which the examples do not define", v.PersistentVolumeClaim.ClaimName)
		}
	}

	// The headless Service lists the engines; the chart values point at it.
	hs := ex.services["vllm-llama"]
	if hs == nil || hs.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("the engines' Service %+v is not headless", hs)
	}
	if d, ok := ex.selected(&metav1.LabelSelector{MatchLabels: hs.Spec.Selector}); !ok || d != vllm {
		t.Errorf("the headless Service does not select the vLLM pods")
	}
	host := hs.Name + ".default.svc.cluster.local"
	var kvPort, replayPort int32
	flag := func(name string) string { // the value of a vLLM flag, "" if absent
		i := slices.Index(c.Args, name)
		if i < 0 || i+1 >= len(c.Args) {
			return ""
		}
		return c.Args[i+1]
	}
	for _, p := range hs.Spec.Ports {
		if cp := containerPort(c, p.TargetPort.StrVal); cp == 0 {
			t.Errorf("headless Service port %s targets %q, no vLLM port", p.Name, p.TargetPort.String())
		} else if cp != p.Port {
			// A headless Service translates no port: clients reach each
			// pod's address on the port itself.
			t.Errorf("headless Service port %s is %d but the pods serve it on %d", p.Name, p.Port, cp)
		}
		switch p.Name {
		case "kv-events":
			kvPort = p.Port
		case "kv-replay":
			replayPort = p.Port
		}
	}
	for name, r := range renders {
		for dname, d := range r.deployments {
			lc := r.configOf(t, dname, d)
			if lc == nil {
				continue
			}
			for _, m := range lc.parsed.Models {
				for _, g := range m.DNS {
					if g.Host != host || int32(g.Port) != enginePort {
						t.Errorf("%s: %s's engines are %s:%d, the example fleet is %s:%d", name, dname, g.Host, g.Port, host, enginePort)
					}
					if m.Index == config.IndexEvents && (int32(g.KVEventsPort) != kvPort || int32(g.KVEventsReplayPort) != replayPort) {
						t.Errorf("%s: kv_events_port %d and kv_events_replay_port %d, the engines publish on %d and replay on %d", name, g.KVEventsPort, g.KVEventsReplayPort, kvPort, replayPort)
					}
				}
				if b := flag("--block-size"); b != strconv.Itoa(m.BlockSize) {
					t.Errorf("%s: block_size %d, vLLM's --block-size %q", name, m.BlockSize, b)
				}
				if l := flag("--max-model-len"); m.MaxModelLen != 0 && l != strconv.Itoa(m.MaxModelLen) {
					t.Errorf("%s: max_model_len %d, vLLM's --max-model-len %q", name, m.MaxModelLen, l)
				}
				if !strings.Contains(args, "--served-model-name "+m.Name) {
					t.Errorf("%s: model %q is not what vLLM serves (%s)", name, m.Name, args)
				}
				for _, vm := range d.Spec.Template.Spec.Volumes {
					if vm.PersistentVolumeClaim != nil && pvcs[vm.PersistentVolumeClaim.ClaimName] == nil {
						t.Errorf("%s: %s mounts PersistentVolumeClaim %s, which the examples do not define", name, dname, vm.PersistentVolumeClaim.ClaimName)
					}
				}
			}
		}
	}

	// Mode 2: the route sends to the pool, the pool to the engines, its
	// picker is the chart's picker Service.
	epp := renders["inferrail-epp-values.yaml"]
	if epp == nil {
		return
	}
	if len(epp.deployments) != 1 || epp.deployments["inferrail-epp"] == nil {
		t.Errorf("inferrail-epp-values.yaml renders Deployments %v, want only the picker", slices.Collect(maps.Keys(epp.deployments)))
	}
	if len(pools) != 1 {
		t.Fatalf("%d InferencePools in epp.yaml, want 1", len(pools))
	}
	for pname, p := range pools {
		if !labels.SelectorFromSet(p.Spec.Selector.MatchLabels).Matches(labels.Set(vllm.Spec.Template.Labels)) {
			t.Errorf("InferencePool/%s selects %v, not the vLLM pods", pname, p.Spec.Selector.MatchLabels)
		}
		if p.Spec.TargetPorts[0].Number != enginePort {
			t.Errorf("InferencePool/%s targets port %d, vLLM serves %d", pname, p.Spec.TargetPorts[0].Number, enginePort)
		}
		svc := epp.services[p.Spec.EndpointPickerRef.Name]
		if svc == nil {
			t.Errorf("InferencePool/%s: endpointPickerRef %s is not the picker Service the chart renders (%v)", pname, p.Spec.EndpointPickerRef.Name, slices.Collect(maps.Keys(epp.services)))
		} else if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
			return sp.Port == p.Spec.EndpointPickerRef.Port.Number && sp.Name == "grpc"
		}) {
			t.Errorf("InferencePool/%s: endpointPickerRef port %d is not the picker's grpc port", pname, p.Spec.EndpointPickerRef.Port.Number)
		}
		if name, ns := epp.eppPool(t, "inferrail-epp"); name != pname || ns != namespace {
			t.Errorf("the picker watches %s/%s, epp.yaml defines %s (rendered into %s)", ns, name, pname, namespace)
		}
	}
	if len(routes) == 0 || len(gateways) == 0 {
		t.Fatal("epp.yaml needs a Gateway and an HTTPRoute")
	}
	for rname, rt := range routes {
		for _, pr := range rt.Spec.ParentRefs {
			if gateways[pr.Name] == nil {
				t.Errorf("HTTPRoute/%s: parentRef %s is no Gateway of the example", rname, pr.Name)
			}
		}
		for _, rule := range rt.Spec.Rules {
			for _, br := range rule.BackendRefs {
				if br.Group != "inference.networking.k8s.io" || br.Kind != "InferencePool" || pools[br.Name] == nil {
					t.Errorf("HTTPRoute/%s: backendRef %+v is not the example's InferencePool", rname, br)
				}
			}
		}
	}
}

// gatewayObj and httpRoute are the parts of gateway.networking.k8s.io/v1
// Gateway and HTTPRoute the example uses (decoded strictly).
type gatewayObj struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		GatewayClassName string `json:"gatewayClassName"`
		Listeners        []struct {
			Name     string `json:"name"`
			Protocol string `json:"protocol"`
			Port     int32  `json:"port"`
			Hostname string `json:"hostname,omitempty"`
		} `json:"listeners"`
	} `json:"spec"`
}

type httpRoute struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		ParentRefs []struct {
			Group       string `json:"group,omitempty"`
			Kind        string `json:"kind,omitempty"`
			Name        string `json:"name"`
			Namespace   string `json:"namespace,omitempty"`
			SectionName string `json:"sectionName,omitempty"`
		} `json:"parentRefs"`
		Rules []struct {
			Matches []struct {
				Path *struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path,omitempty"`
			} `json:"matches,omitempty"`
			BackendRefs []struct {
				Group string `json:"group"`
				Kind  string `json:"kind"`
				Name  string `json:"name"`
			} `json:"backendRefs"`
			Timeouts *struct {
				Request        string `json:"request,omitempty"`
				BackendRequest string `json:"backendRequest,omitempty"`
			} `json:"timeouts,omitempty"`
		} `json:"rules"`
	} `json:"spec"`
}
