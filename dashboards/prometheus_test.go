package dashboards

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// defaultPrometheus is where Debian's prometheus package puts the server
// (make prometheus-deps installs it); INFERRAIL_PROMETHEUS overrides it.
const defaultPrometheus = "/usr/bin/prometheus"

// Bounds of the Prometheus test: the traffic, and the longest it may take
// in all (build, start-up, traffic, queries, shutdown).
const (
	trafficFor  = 30 * time.Second
	evaluateAt  = 27 * time.Second // queries run while the traffic still flows
	testTimeout = 110 * time.Second
)

// mustShowData are panels whose data the faults and the load of the test
// are there to produce: each must have a sample above zero, not only a
// series. Every other panel must at least not be empty.
var mustShowData = []string{
	"Requests served",
	"Not served",
	"Gateway TTFT per replica (p50, p99)",
	"Gateway TTFT per policy (p50, p99)",
	"Engine TTFT per replica (p50, p99)",
	"Proxy overhead (p50, p99)",
	"In flight and pending per replica (gateway)",
	"Queued requests (peak)",
	"Queue wait (p50, p99)",
	"Engine running and waiting per replica (vLLM)",
	"KV cache usage per replica",
	"Traffic share per policy and replica",
	"Decision time (p50, p99)",
	"Predicted vs engine-measured hit rate",
	"Engine prefix cache hit rate per replica (vLLM)",
	"KV index blocks per replica",
	"Reserved vs capacity KV blocks per replica",
	"Rejections by reason",
	"Requests by outcome",
	"Upstream errors by reason",
	"Retries",
	"Ejections",
	"Tokenization outcomes",
	"Engine metric scrapes failing",
	"Build",
}

// Every panel's every query, evaluated by a real Prometheus that scrapes a
// live gateway and three engines (one failing requests and serving a
// garbage metrics page) under about 30 s of chat and completion traffic,
// returns data.
func TestDashboardAgainstPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped with -short: runs Prometheus, a gateway and three engines under 30 s of traffic")
	}
	promBin := defaultPrometheus
	if p := os.Getenv("INFERRAIL_PROMETHEUS"); p != "" {
		promBin = p
	}
	if _, err := os.Stat(promBin); err != nil {
		t.Fatalf("this test needs Debian's prometheus at %s (make prometheus-deps installs it, or set INFERRAIL_PROMETHEUS): %v", promBin, err)
	}
	d, err := loadDashboard(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, title := range mustShowData {
		if !slices.ContainsFunc(allPanels(d), func(p panel) bool { return p.Title == title }) {
			t.Fatalf("mustShowData names panel %q, which the dashboard lacks", title)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	began := time.Now()
	dir := t.TempDir()
	ports, err := freePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	enginePorts, listenPort, adminPort, promPort := ports[:3], ports[3], ports[4], ports[5]
	replicas := []string{"a", "b", "c"}
	h := &harness{t: t, dir: dir}
	t.Cleanup(h.stopAll)

	// Prometheus first: it starts while the binary builds.
	promCfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promCfg, []byte(prometheusConfig(adminPort, enginePorts, replicas)), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := h.start("prometheus", promBin,
		"--config.file="+promCfg,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+hostPort(promPort),
		"--storage.tsdb.retention.time=1h",
		"--log.level=warn")
	promURL := "http://" + hostPort(promPort)

	bin, err := buildInferrail(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built inferrail in %v", time.Since(began).Round(time.Millisecond))

	engines := make([]*proc, 3)
	for i, port := range enginePorts {
		args := []string{"engine", "--port", strconv.Itoa(port), "--seed", strconv.Itoa(i + 1),
			"--enable-prompt-tokens-details", "--drain-timeout", "0s",
			"--served-model-name", "inferrail-sim", "--served-model-name", "inferrail-chat"}
		if replicas[i] == "c" {
			// Faults: failed and dropped attempts (retries, upstream
			// errors, ejections), stalled streams (broken streams) and a
			// page no one can read (scrape errors).
			args = append(args, "--fault-error-rate", "0.5", "--fault-error-status", "503",
				"--fault-close-rate", "0.1", "--fault-stall-rate", "0.05", "--fault-garbage-metrics")
		}
		engines[i] = h.start("engine-"+replicas[i], bin, args...)
	}
	for i, port := range enginePorts {
		if err := waitHTTP(ctx, engines[i], "http://"+hostPort(port)+"/health", 15*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	liveCfg := filepath.Join(dir, "live.yaml")
	if err := os.WriteFile(liveCfg, []byte(liveConfig(listenPort, adminPort, enginePorts, replicas)), 0o644); err != nil {
		t.Fatal(err)
	}
	live := h.start("live", bin, "live", "--config", liveCfg)
	gateway := "http://" + hostPort(listenPort)
	if err := waitHTTP(ctx, live, gateway+"/readyz", 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitHTTP(ctx, prom, promURL+"/-/ready", 15*time.Second); err != nil {
		t.Fatal(err)
	}

	// Traffic: completions on one model (cost_model), chat on the other
	// (least_request), both more than the small caps admit at once, so
	// requests queue and some are refused.
	sets := []string{
		"--set", "w1.prompts=4", "--set", "w1.prompt_min_tokens=200", "--set", "w1.prompt_max_tokens=600",
		"--set", "w1.question_min_tokens=20", "--set", "w1.question_max_tokens=80",
		"--set", "output.median=48", "--set", "output.min=8", "--set", "output.max_tokens=128",
	}
	benchArgs := func(model, endpoint, rate string) []string {
		return append([]string{"bench", "--base-url", gateway, "--model", model, "--endpoint", endpoint,
			"--workload", "w1", "--rate", rate, "--duration", trafficFor.String(), "--timeout", "15s", "--json"}, sets...)
	}
	trafficStart := time.Now()
	h.start("bench-completions", bin, benchArgs("inferrail-sim", "completions", "12")...)
	h.start("bench-chat", bin, benchArgs("inferrail-chat", "chat", "8")...)
	select {
	case <-time.After(evaluateAt):
	case <-ctx.Done():
		t.Fatalf("timed out before the traffic ended: %v", ctx.Err())
	}
	// Everything still runs: the traffic lasts beyond this instant.
	for _, p := range h.running() {
		if p.exited() {
			t.Fatalf("%s exited during the traffic (%v):\n%s", p.name, p.cmd.ProcessState, tail(p.log, 20))
		}
	}
	// One more scrape of the gateway after this instant, so its counters
	// are in Prometheus as the queries begin.
	if err := waitScrapedAfter(ctx, promURL, time.Now(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("traffic for %v, now querying", time.Since(trafficStart).Round(time.Millisecond))

	pc := &promClient{base: promURL, http: &http.Client{Timeout: 10 * time.Second}}
	checkAgainstPrometheus(ctx, t, pc, d)
	t.Logf("queries done %v after the start", time.Since(began).Round(time.Millisecond))
}

// checkAgainstPrometheus evaluates every query of d in Prometheus, with
// every model and replica selected as All (.*) and as the list of every
// value (what a multi-value selection sends), and checks the metric names
// and types Prometheus holds.
func checkAgainstPrometheus(ctx context.Context, t *testing.T, pc *promClient, d *dashboard) {
	t.Helper()
	// Every series the dashboard names has been scraped by Prometheus.
	used, err := usedMetrics(d)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pc.labelValues(ctx, "__name__")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range used {
		if !slices.Contains(names, n) {
			t.Errorf("Prometheus holds no series of %s, which the dashboard selects", n)
		}
	}
	// The gateway's histograms are what the unit test takes them for.
	meta, err := pc.metadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, typ := range meta {
		if !strings.HasPrefix(name, "inferrail_") {
			continue
		}
		if isHist := typ == "histogram"; isHist != slices.Contains(gatewayHistograms, name) {
			t.Errorf("Prometheus says %s is a %s: gatewayHistograms disagrees", name, typ)
		}
	}

	// The variables' values, as Grafana would list them.
	multi := allValues()
	for _, name := range []string{"model", "replica"} {
		var v variable
		for _, tv := range d.Templating.List {
			if tv.Name == name {
				v = tv
			}
		}
		sel, label, err := variableSelector(v)
		if err != nil {
			t.Fatal(err)
		}
		sel, err = substitute(sel, multi)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := pc.seriesLabel(ctx, sel, label)
		if err != nil {
			t.Fatal(err)
		}
		if len(vals) == 0 {
			t.Fatalf("variable %s: %s lists no %s", name, sel, label)
		}
		t.Logf("variable %s: %v", name, vals)
		quoted := make([]string, len(vals))
		for i, v := range vals {
			quoted[i] = regexp.QuoteMeta(v)
		}
		multi[name] = "(" + strings.Join(quoted, "|") + ")"
	}

	var empty []string
	for _, pass := range []struct {
		name string
		vals map[string]string
	}{{"All", allValues()}, {"every value", multi}} {
		nonZero := map[string]bool{}
		peak := map[string]float64{}
		for _, q := range queries(d) {
			expr, err := substitute(q.expr, pass.vals)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			samples, err := pc.query(ctx, expr)
			if err != nil {
				t.Errorf("%s (%s): %v", q, pass.name, err)
				continue
			}
			if len(samples) == 0 {
				empty = append(empty, fmt.Sprintf("%s (%s): no data for %s", q, pass.name, expr))
				continue
			}
			for _, v := range samples {
				if v != 0 && !math.IsNaN(v) {
					nonZero[q.panel.Title] = true
					peak[q.panel.Title] = max(peak[q.panel.Title], math.Abs(v))
				}
			}
		}
		var peaks []string
		for _, title := range mustShowData {
			peaks = append(peaks, fmt.Sprintf("%s %.3g", title, peak[title]))
		}
		t.Logf("%s: largest sample per panel that must show data: %s", pass.name, strings.Join(peaks, "; "))
		for _, title := range mustShowData {
			if !nonZero[title] {
				empty = append(empty, fmt.Sprintf("panel %q (%s): every sample is 0 or NaN: the load or the faults did not produce its data", title, pass.name))
			}
		}
	}
	for _, e := range empty {
		t.Error(e)
	}
}

// prometheusConfig scrapes the gateway's admin /metrics and the engines'
// /metrics every second, each engine labelled with its replica name.
func prometheusConfig(adminPort int, enginePorts []int, replicas []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global:
  scrape_interval: 1s
  scrape_timeout: 800ms
  evaluation_interval: 1s
scrape_configs:
  - job_name: inferrail
    static_configs:
      - targets: ['%s']
  - job_name: vllm
    static_configs:
`, hostPort(adminPort))
	for i, p := range enginePorts {
		fmt.Fprintf(&b, "      - targets: ['%s']\n        labels: {replica: %s}\n", hostPort(p), replicas[i])
	}
	return b.String()
}

// liveConfig is a gateway with two models on the same three engines, small
// caps and a short queue (so requests wait and some are refused), fast
// health checks and ejections, and short stream bounds (so stalled streams
// break within the test).
func liveConfig(listenPort, adminPort int, enginePorts []int, replicas []string) string {
	var reps strings.Builder
	for i, p := range enginePorts {
		fmt.Fprintf(&reps, "      - {name: %s, url: \"http://%s\"}\n", replicas[i], hostPort(p))
	}
	model := func(name, policy string) string {
		return fmt.Sprintf(`  - name: %s
    policy: %s
    tokenizer: builtin:sim
    admission: kv
    kv_capacity_blocks: 120
    max_concurrency: 2
    queue: {max_requests: 6, timeout: 2s}
    replicas:
%s`, name, policy, reps.String())
	}
	return fmt.Sprintf(`listen: %s
admin_listen: %s
drain_delay: 0s
drain_timeout: 1s
request_timeout: 20s
first_byte_timeout: 2s
stream_idle_timeout: 1s
log: {level: warn, access_sample: 0}
retry: {attempts: 3, backoff: 5ms, max_backoff: 50ms}
health: {interval: 1s, timeout: 300ms, eject_after: 3, eject_time: 1s, max_eject_time: 2s}
scrape: {interval: 100ms, timeout: 80ms, max_age: 500ms}
models:
%s%s`, hostPort(listenPort), hostPort(adminPort), model("inferrail-sim", "cost_model"), model("inferrail-chat", "least_request"))
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// freePorts returns n distinct free loopback ports (held open together so
// none is handed out twice).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// buildInferrail builds the inferrail command into dir.
func buildInferrail(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build inferrail: %w", err)
	}
	bin := filepath.Join(dir, "inferrail")
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/inferrail")
	cmd.Dir = ".."
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/inferrail: %w\n%s", err, out)
	}
	return bin, nil
}

// harness starts processes, each in its own process group, and stops them
// all (group and all) when the test ends.
type harness struct {
	t     *testing.T
	dir   string
	mu    sync.Mutex
	procs []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// start runs bin with args, its output in dir/name.log; a failure to start
// fails the test.
func (h *harness) start(name, bin string, args ...string) *proc {
	h.t.Helper()
	logPath := filepath.Join(h.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		h.t.Fatalf("log of %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		h.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
	return p
}

// running returns the processes started so far.
func (h *harness) running() []*proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.procs)
}

// stopAll sends SIGTERM to every process group, SIGKILL to those still
// running after a grace period, and reports a process that outlives both.
// On failure it shows the end of every log.
func (h *harness) stopAll() {
	h.mu.Lock()
	ps := h.procs
	h.procs = nil
	h.mu.Unlock()
	for _, p := range ps {
		if !p.exited() {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	grace := time.After(3 * time.Second)
	for _, p := range ps {
		select {
		case <-p.done:
		case <-grace:
		}
	}
	for _, p := range ps {
		// The group too: a process may have left children behind.
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			h.t.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
		}
	}
	if h.t.Failed() {
		for _, p := range ps {
			h.t.Logf("--- %s (%s), last lines:\n%s", p.name, p.log, tail(p.log, 25))
		}
	}
}

// tail returns the last n lines of the log at path, at most 4 KiB
// (progress bars redraw with carriage returns: those end lines too).
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	s := strings.ReplaceAll(string(b), "\r", "\n")
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls u until it answers 200, p exits, or within expires.
func waitHTTP(ctx context.Context, p *proc, u string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	c := &http.Client{Timeout: time.Second}
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", p.name, err)
		}
		resp, err := c.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered (%v):\n%s", p.name, u, p.cmd.ProcessState, tail(p.log, 20))
		case <-ctx.Done():
			return fmt.Errorf("%s: %s not ready within %v: %w", p.name, u, within, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitScrapedAfter waits until Prometheus holds a sample of the gateway
// scraped after at.
func waitScrapedAfter(ctx context.Context, promURL string, at time.Time, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	pc := &promClient{base: promURL, http: &http.Client{Timeout: 2 * time.Second}}
	var last error
	for {
		v, err := pc.query(ctx, "max(timestamp(inferrail_build_info))")
		if err == nil && len(v) == 1 && v[0] >= float64(at.UnixMilli())/1000 {
			return nil
		}
		last = err
		if err == nil {
			last = fmt.Errorf("last sample at %v", v)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no scrape of the gateway after %v within %v: %w", at.Format(time.RFC3339Nano), within, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// promClient speaks Prometheus's HTTP API.
type promClient struct {
	base string
	http *http.Client
}

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (c *promClient) get(ctx context.Context, path string, params url.Values, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path+"?"+params.Encode(), nil)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("prometheus %s: status %d, unreadable answer: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("prometheus %s: %s: %s", path, r.ErrorType, r.Error)
	}
	if err := json.Unmarshal(r.Data, into); err != nil {
		return fmt.Errorf("prometheus %s: decode data: %w", path, err)
	}
	return nil
}

// query evaluates expr at the current time and returns its samples'
// values (one for a scalar).
func (c *promClient) query(ctx context.Context, expr string) ([]float64, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := c.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	parse := func(pair [2]json.RawMessage) (float64, error) {
		var s string
		if err := json.Unmarshal(pair[1], &s); err != nil {
			return 0, fmt.Errorf("sample value: %w", err)
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, fmt.Errorf("sample value: %w", err)
		}
		return v, nil
	}
	switch data.ResultType {
	case "vector":
		var vec []struct {
			Value [2]json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &vec); err != nil {
			return nil, fmt.Errorf("decode vector: %w", err)
		}
		out := make([]float64, 0, len(vec))
		for _, s := range vec {
			v, err := parse(s.Value)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case "scalar":
		var pair [2]json.RawMessage
		if err := json.Unmarshal(data.Result, &pair); err != nil {
			return nil, fmt.Errorf("decode scalar: %w", err)
		}
		v, err := parse(pair)
		if err != nil {
			return nil, err
		}
		return []float64{v}, nil
	}
	return nil, fmt.Errorf("result type %q: a panel query must give a vector or a scalar", data.ResultType)
}

func (c *promClient) labelValues(ctx context.Context, label string) ([]string, error) {
	var vals []string
	if err := c.get(ctx, "/api/v1/label/"+label+"/values", url.Values{}, &vals); err != nil {
		return nil, err
	}
	return vals, nil
}

// seriesLabel returns the distinct values of label over the series sel
// matches.
func (c *promClient) seriesLabel(ctx context.Context, sel, label string) ([]string, error) {
	var series []map[string]string
	if err := c.get(ctx, "/api/v1/series", url.Values{"match[]": {sel}}, &series); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, s := range series {
		if v, ok := s[label]; ok {
			seen[v] = true
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out, nil
}

// metadata returns each metric's type as Prometheus recorded it from the
// targets' pages.
func (c *promClient) metadata(ctx context.Context) (map[string]string, error) {
	var meta map[string][]struct {
		Type string `json:"type"`
	}
	if err := c.get(ctx, "/api/v1/metadata", url.Values{}, &meta); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, ms := range meta {
		if len(ms) == 0 {
			return nil, errors.New("prometheus metadata: " + name + " without a type")
		}
		out[name] = ms[0].Type
	}
	return out, nil
}
