package dashboards

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

const (
	dashboardPath = "inferrail.json"
	goldenPath    = "../live/testdata/metrics.golden"
	// dsVar is how every panel and target names its data source: the
	// datasource template variable, which the DS_PROMETHEUS import input
	// sets.
	dsVar = "${datasource}"
)

// gatewayHistograms are the gateway's histograms (the golden file lists
// names, help and labels, not types): their series are name_bucket,
// name_sum and name_count. Each must be in the golden file; the
// Prometheus test checks against Prometheus's metadata that these, and no
// other gateway metric, are histograms.
var gatewayHistograms = []string{
	"inferrail_decision_seconds",
	"inferrail_proxy_overhead_seconds",
	"inferrail_queue_wait_seconds",
	"inferrail_request_duration_seconds",
	"inferrail_time_to_first_byte_seconds",
}

// engineTargetLabels are the labels the scrape configuration adds to every
// engine series (replica, the gateway's name of the engine) besides
// Prometheus's own job and instance.
var engineTargetLabels = []string{"replica"}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	Panels        []panel `json:"panels"`
	Inputs        []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Collapsed  bool        `json:"collapsed"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	IncludeAll bool            `json:"includeAll"`
	Multi      bool            `json:"multi"`
	AllValue   string          `json:"allValue"`
	Datasource *datasource     `json:"datasource"`
}

// query is the variable's query string (a string, or an object with a
// query field, as Grafana's Prometheus variable editor writes it).
func (v variable) query() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &o) == nil && o.Query != "" {
		return o.Query
	}
	return v.Definition
}

func loadDashboard(path string) (*dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read dashboard: %w", err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &d, nil
}

// allPanels returns every panel, rows and the panels nested in collapsed
// rows included, in order.
func allPanels(d *dashboard) []panel {
	var out []panel
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\$([A-Za-z0-9_]+)`)

// substitute replaces Grafana's variables ($name, ${name}, ${name:fmt}) in
// expr with vals; a variable vals lacks is an error.
func substitute(expr string, vals map[string]string) (string, error) {
	var missing []string
	out := varRef.ReplaceAllStringFunc(expr, func(m string) string {
		sm := varRef.FindStringSubmatch(m)
		name := sm[1] + sm[2]
		v, ok := vals[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("unknown variable %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// allValues are the variables' values with every model and replica
// selected (Grafana's "All", allValue .*) and rate windows of one minute.
func allValues() map[string]string {
	return map[string]string{
		"model": ".*", "replica": ".*",
		"__rate_interval": "1m", "__interval": "15s", "__range": "1m",
	}
}

// selector is one metric a query selects and the labels it matches on.
type selector struct {
	name   string
	labels []string
}

var promql = parser.NewParser(parser.Options{})

// selectors parses expr and returns every vector selector in it.
func selectors(expr string) ([]selector, error) {
	e, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	var out []selector
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{name: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if m.Type != labels.MatchEqual {
					bad = errors.Join(bad, fmt.Errorf("selector %s picks metrics by a pattern: name them", vs))
				}
				s.name = m.Value
				continue
			}
			s.labels = append(s.labels, m.Name)
		}
		out = append(out, s)
		return nil
	})
	return out, bad
}

// exported is the set of series names someone exports, each with the
// labels its series carry.
type exported map[string]map[string]bool

func (x exported) add(name string, lbls ...string) {
	if x[name] == nil {
		x[name] = map[string]bool{"job": true, "instance": true}
	}
	for _, l := range lbls {
		x[name][l] = true
	}
}

// addFamily adds a metric family's series names: a histogram's _bucket,
// _sum and _count, a summary's name, _sum and _count.
func (x exported) addFamily(name string, typ dto.MetricType, lbls ...string) {
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		x.add(name+"_bucket", append(slices.Clone(lbls), "le")...)
		x.add(name+"_sum", lbls...)
		x.add(name+"_count", lbls...)
	case dto.MetricType_SUMMARY:
		x.add(name, append(slices.Clone(lbls), "quantile")...)
		x.add(name+"_sum", lbls...)
		x.add(name+"_count", lbls...)
	default:
		x.add(name, lbls...)
	}
}

var goldenLine = regexp.MustCompile(`^Desc\{fqName: "([^"]+)".*variableLabels: \{([^}]*)\}\}$`)

// gatewayMetrics reads the gateway's metric set from the golden file of
// live's TestMetricSet.
func gatewayMetrics(path string) (exported, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gateway metric set: %w", err)
	}
	defer f.Close()
	names := map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		m := goldenLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("%s:%d: not a metric description: %q", path, n, line)
		}
		var lbls []string
		if m[2] != "" {
			lbls = strings.Split(m[2], ",")
		}
		names[m[1]] = lbls
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s lists no metric", path)
	}
	x := exported{}
	for _, h := range gatewayHistograms {
		if _, ok := names[h]; !ok {
			return nil, fmt.Errorf("histogram %s is not in %s", h, path)
		}
	}
	for name, lbls := range names {
		typ := dto.MetricType_UNTYPED
		if slices.Contains(gatewayHistograms, name) {
			typ = dto.MetricType_HISTOGRAM
		}
		x.addFamily(name, typ, lbls...)
	}
	return x, nil
}

// familyLabels adds every family's series to x, with the labels its
// samples carry and extra.
func (x exported) addFamilies(fams map[string]*dto.MetricFamily, extra ...string) {
	for name, f := range fams {
		seen := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				seen[l.GetName()] = true
			}
		}
		lbls := slices.Clone(extra)
		for l := range seen {
			lbls = append(lbls, l)
		}
		x.addFamily(name, f.GetType(), lbls...)
	}
}

// engineMetrics scrapes an in-process mock engine's /metrics (the engine
// need not run: its page is complete from the start).
func engineMetrics() (exported, error) {
	s, err := server.New(server.Config{Engine: engine.DefaultConfig()})
	if err != nil {
		return nil, fmt.Errorf("mock engine: %w", err)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		return nil, fmt.Errorf("mock engine /metrics: status %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		return nil, fmt.Errorf("parse the mock engine's /metrics: %w", err)
	}
	if len(fams) == 0 {
		return nil, errors.New("the mock engine's /metrics is empty")
	}
	x := exported{}
	x.addFamilies(fams, engineTargetLabels...)
	return x, nil
}

// runtimeMetrics are Go's and the process's collectors, which the gateway
// registers beside its own metrics.
func runtimeMetrics() (exported, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	fams, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather go and process metrics: %w", err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	x := exported{}
	x.addFamilies(m)
	return x, nil
}

// allExported merges the gateway's, the engines' and the runtime's series.
func allExported() (exported, error) {
	x := exported{}
	for _, get := range []func() (exported, error){
		func() (exported, error) { return gatewayMetrics(goldenPath) },
		engineMetrics, runtimeMetrics,
	} {
		y, err := get()
		if err != nil {
			return nil, err
		}
		for name, lbls := range y {
			for l := range lbls {
				x.add(name, l)
			}
		}
	}
	return x, nil
}

// queryRef is one query of one panel.
type queryRef struct {
	panel panel
	refID string
	expr  string
}

func (q queryRef) String() string {
	return fmt.Sprintf("panel %d %q query %s", q.panel.ID, q.panel.Title, q.refID)
}

// queries returns every query of every panel.
func queries(d *dashboard) []queryRef {
	var out []queryRef
	for _, p := range allPanels(d) {
		for _, t := range p.Targets {
			out = append(out, queryRef{panel: p, refID: t.RefID, expr: t.Expr})
		}
	}
	return out
}

var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// variableSelector returns the series selector and the label of a
// label_values(selector, label) variable query.
func variableSelector(v variable) (string, string, error) {
	m := labelValuesQuery.FindStringSubmatch(strings.TrimSpace(v.query()))
	if m == nil {
		return "", "", fmt.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.query())
	}
	return m[1], m[2], nil
}

// checkSelectors reports each selector of expr that names a series nobody
// exports or matches on a label that series does not carry.
func checkSelectors(where, expr string, x exported) []error {
	sels, err := selectors(expr)
	if err != nil {
		return []error{fmt.Errorf("%s: %q: %w", where, expr, err)}
	}
	if len(sels) == 0 {
		return []error{fmt.Errorf("%s: %q selects no metric", where, expr)}
	}
	var errs []error
	for _, s := range sels {
		lbls, ok := x[s.name]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: metric %s is exported by neither the gateway nor the engines", where, s.name))
			continue
		}
		for _, l := range s.labels {
			if !lbls[l] {
				errs = append(errs, fmt.Errorf("%s: %s has no label %s", where, s.name, l))
			}
		}
	}
	return errs
}

// checkDashboard reports every problem of d against the exported series
// x: panels without a title, a unique id or a target, queries that do not
// parse or select what nobody exports, data sources other than the
// datasource variable, variables that are missing or wrong.
func checkDashboard(d *dashboard, x exported) []error {
	var errs []error
	if d.SchemaVersion < 36 {
		errs = append(errs, fmt.Errorf("schemaVersion %d: want 36 or later (Grafana 9+)", d.SchemaVersion))
	}
	if d.Title == "" || d.UID == "" {
		errs = append(errs, errors.New("the dashboard needs a title and a uid"))
	}
	hasInput := false
	for _, in := range d.Inputs {
		if in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus" {
			hasInput = true
		}
	}
	if !hasInput {
		errs = append(errs, errors.New("__inputs lacks the DS_PROMETHEUS Prometheus data source"))
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.query() != "prometheus" {
		errs = append(errs, errors.New(`templating needs a "datasource" variable of type datasource for prometheus`))
	}
	for _, name := range []string{"model", "replica"} {
		v, ok := vars[name]
		if !ok {
			errs = append(errs, fmt.Errorf("templating lacks the %s variable", name))
			continue
		}
		if v.Type != "query" || !v.IncludeAll || v.AllValue != ".*" || v.Datasource == nil || v.Datasource.UID != dsVar {
			errs = append(errs, fmt.Errorf("variable %s: want a query variable on %s with All as .*", name, dsVar))
		}
		sel, _, err := variableSelector(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sel, err = substitute(sel, allValues())
		if err != nil {
			errs = append(errs, fmt.Errorf("variable %s: %w", name, err))
			continue
		}
		errs = append(errs, checkSelectors("variable "+name, sel, x)...)
	}

	ids := map[int]string{}
	for _, p := range allPanels(d) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.Title == "" {
			errs = append(errs, fmt.Errorf("%s has no title", where))
		}
		if p.ID <= 0 {
			errs = append(errs, fmt.Errorf("%s has no id", where))
		} else if other, dup := ids[p.ID]; dup {
			errs = append(errs, fmt.Errorf("%s: id %d is also %q's", where, p.ID, other))
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 || g.Y < 0 {
			errs = append(errs, fmt.Errorf("%s: gridPos %+v is outside the 24-column grid", where, g))
		}
		if p.Type == "row" {
			if len(p.Targets) > 0 {
				errs = append(errs, fmt.Errorf("%s: a row has no queries", where))
			}
			continue
		}
		if len(p.Panels) > 0 {
			errs = append(errs, fmt.Errorf("%s: only rows nest panels", where))
		}
		if p.Datasource == nil || p.Datasource.UID != dsVar {
			errs = append(errs, fmt.Errorf("%s: data source must be %s", where, dsVar))
		}
		if len(p.Targets) == 0 {
			errs = append(errs, fmt.Errorf("%s has no query", where))
		}
		refs := map[string]bool{}
		for _, t := range p.Targets {
			tw := fmt.Sprintf("%s query %s", where, t.RefID)
			if t.RefID == "" || refs[t.RefID] {
				errs = append(errs, fmt.Errorf("%s: refId must be set and unique in the panel", tw))
			}
			refs[t.RefID] = true
			if t.Datasource == nil || t.Datasource.UID != dsVar {
				errs = append(errs, fmt.Errorf("%s: data source must be %s", tw, dsVar))
			}
			if strings.TrimSpace(t.Expr) == "" {
				errs = append(errs, fmt.Errorf("%s has no expression", tw))
				continue
			}
			expr, err := substitute(t.Expr, allValues())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", tw, err))
				continue
			}
			errs = append(errs, checkSelectors(tw, expr, x)...)
		}
	}
	return errs
}

// usedMetrics returns every series name the dashboard's queries and
// variables select, sorted.
func usedMetrics(d *dashboard) ([]string, error) {
	seen := map[string]bool{}
	exprs := []string{}
	for _, q := range queries(d) {
		exprs = append(exprs, q.expr)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			sel, _, err := variableSelector(v)
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, sel)
		}
	}
	for _, e := range exprs {
		e, err := substitute(e, allValues())
		if err != nil {
			return nil, err
		}
		sels, err := selectors(e)
		if err != nil {
			return nil, err
		}
		for _, s := range sels {
			seen[s.name] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// The dashboard's every query parses, selects only series the gateway, the
// engines or the runtime export, with labels they carry; every panel has
// a title, a unique id and a query on the datasource variable.
func TestDashboard(t *testing.T) {
	d, err := loadDashboard(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	x, err := allExported()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range checkDashboard(d, x) {
		t.Error(e)
	}
	used, err := usedMetrics(d)
	if err != nil {
		t.Fatal(err)
	}
	// The brief of the dashboard: these must each be shown somewhere.
	for _, want := range []string{
		"inferrail_time_to_first_byte_seconds_bucket", "vllm:time_to_first_token_seconds_bucket",
		"inferrail_replica_in_flight", "inferrail_queue_depth", "inferrail_queue_wait_seconds_bucket",
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"inferrail_replica_engine_running", "inferrail_replica_engine_waiting", "inferrail_replica_engine_kv_usage",
		"inferrail_decisions_total", "inferrail_predicted_cached_tokens_total", "inferrail_cached_tokens_total",
		"inferrail_prompt_tokens_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
		"inferrail_decision_seconds_bucket", "inferrail_proxy_overhead_seconds_bucket", "inferrail_retries_total", "inferrail_ejections_total",
		"inferrail_upstream_errors_total", "inferrail_requests_total", "inferrail_rejected_total",
		"inferrail_tokenize_total", "inferrail_index_blocks", "inferrail_index_bytes",
		"inferrail_reserved_blocks", "inferrail_replica_kv_capacity_blocks", "inferrail_scrape_errors_total",
		"inferrail_build_info",
	} {
		if !slices.Contains(used, want) {
			t.Errorf("no panel shows %s", want)
		}
	}
	panels := 0
	for _, p := range allPanels(d) {
		if p.Type != "row" {
			panels++
		}
	}
	t.Logf("%d panels, %d queries, %d metrics", panels, len(queries(d)), len(used))
}

// The checks fail on a dashboard that breaks them: this guards the test
// above against passing on anything.
func TestCheckDashboardCatchesMistakes(t *testing.T) {
	x, err := allExported()
	if err != nil {
		t.Fatal(err)
	}
	good, err := loadDashboard(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if errs := checkDashboard(good, x); len(errs) > 0 {
		t.Fatalf("the dashboard itself has problems: %v", errs)
	}
	ds := &datasource{Type: "prometheus", UID: dsVar}
	mk := func(p panel) *dashboard {
		d := *good
		row := panel{ID: 9001, Type: "row", Title: "r", Collapsed: true, Panels: []panel{p}}
		row.GridPos.W, row.GridPos.H = 24, 1
		d.Panels = append(slices.Clone(good.Panels), row)
		return &d
	}
	pn := func(id int, title string, exprs ...string) panel {
		p := panel{ID: id, Type: "timeseries", Title: title, Datasource: ds}
		p.GridPos.W, p.GridPos.H = 12, 8
		for i, e := range exprs {
			p.Targets = append(p.Targets, target{RefID: string(rune('A' + i)), Expr: e, Datasource: ds})
		}
		return p
	}
	cases := []struct {
		name string
		d    *dashboard
		want string
	}{
		{"unknown metric", mk(pn(9002, "x", `rate(inferrail_no_such_total{model=~"$model"}[$__rate_interval])`)), "inferrail_no_such_total is exported by neither"},
		{"histogram without suffix", mk(pn(9002, "x", `rate(inferrail_decision_seconds[$__rate_interval])`)), "inferrail_decision_seconds is exported by neither"},
		{"suffix on a gauge", mk(pn(9002, "x", `inferrail_queue_depth_bucket`)), "inferrail_queue_depth_bucket is exported by neither"},
		{"unknown engine metric", mk(pn(9002, "x", `vllm:gpu_cache_usage_perc`)), "vllm:gpu_cache_usage_perc is exported by neither"},
		{"label the metric lacks", mk(pn(9002, "x", `inferrail_queue_depth{replica=~"$replica"}`)), "inferrail_queue_depth has no label replica"},
		{"engine label typo", mk(pn(9002, "x", `vllm:num_requests_running{model=~"$model"}`)), "vllm:num_requests_running has no label model"},
		{"unparsable", mk(pn(9002, "x", `sum(rate(inferrail_retries_total[1m])`)), "parse"},
		{"unknown variable", mk(pn(9002, "x", `inferrail_queue_depth{model=~"$modell"}`)), "unknown variable modell"},
		{"name by pattern", mk(pn(9002, "x", `{__name__=~"inferrail_.*"}`)), "by a pattern"},
		{"no title", mk(pn(9002, "", `inferrail_queue_depth`)), "has no title"},
		{"no query", mk(pn(9002, "x")), "has no query"},
		{"duplicate id", mk(pn(good.Panels[0].ID, "x", `inferrail_queue_depth`)), "is also"},
		{"fixed data source", func() *dashboard {
			p := pn(9002, "x", `inferrail_queue_depth`)
			p.Datasource = &datasource{Type: "prometheus", UID: "abc"}
			return mk(p)
		}(), "data source must be"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := checkDashboard(c.d, x)
			for _, e := range errs {
				if strings.Contains(e.Error(), c.want) {
					return
				}
			}
			t.Errorf("want a problem containing %q, got %v", c.want, errs)
		})
	}
	// A panel nested in a collapsed row is walked.
	if n, m := len(allPanels(mk(pn(9002, "x", "up")))), len(allPanels(good)); n != m+2 {
		t.Errorf("allPanels: %d panels, want the row and its nested panel", n)
	}
}

// The engine's metric names come from its real /metrics page.
func TestEngineMetricNames(t *testing.T) {
	x, err := engineMetrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket", "vllm:prefix_cache_hits_total"} {
		if _, ok := x[n]; !ok {
			t.Errorf("the mock engine does not export %s", n)
		}
	}
	if _, ok := x["vllm:time_to_first_token_seconds"]; ok {
		t.Error("a histogram's bare name counted as a series")
	}
	if !x["vllm:num_requests_running"]["model_name"] {
		t.Error("vllm:num_requests_running lacks its model_name label")
	}
	if _, err := gatewayMetrics(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing golden file is not an error")
	}
}
