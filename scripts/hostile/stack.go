package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// errStack marks a failure to start the engines or the proxy: the harness
// cannot measure anything then.
var errStack = errors.New("stack did not start")

// harness is what every scenario shares.
type harness struct {
	bin         string // absolute path of inferrail
	self        string // this program, for the stall workers
	tmp         string
	nodeModules string // absolute; "" when the SDK is not installed
	keys        keyReport
}

// newKeys are the configuration keys the hardening work adds, with a value
// that is only used to ask live whether it knows the key (--check).
var newKeys = []optKey{
	{"read_timeout", "30s"},
	{"write_timeout", "30s"},
	{"first_byte_timeout", "2s"},
	{"stream_idle_timeout", "60s"},
	{"drain_delay", "0s"},
	{"max_connections", "10000"},
	{"max_connections_per_client", "1000"},
	{"flood_connections_per_client", "256"},
	{"max_concurrent_streams", "100"},
	{"max_inflight_body_bytes", "256MiB"},
	{"predicted_cached_header", "false"},
	{"models[0].predicted_cached_header", "false"},
}

// optKey is one optional configuration key: a top-level name, or
// models[0].name for the model.
type optKey struct {
	path, value string
}

// keyReport is which new keys live accepted (--check) at startup.
type keyReport struct {
	accepted, refused []string
	note              string
}

// tmpRoot is the harness's scratch directory, removed on return and on
// Ctrl-C.
var tmpRoot struct {
	sync.Mutex
	dir string
}

func removeTmp() {
	tmpRoot.Lock()
	defer tmpRoot.Unlock()
	if tmpRoot.dir != "" {
		os.RemoveAll(tmpRoot.dir)
		tmpRoot.dir = ""
	}
}

func newHarness(bin, nodeModules string) (*harness, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("binary %s: %w (run make build)", bin, err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "hostile-")
	if err != nil {
		return nil, err
	}
	tmpRoot.Lock()
	tmpRoot.dir = tmp
	tmpRoot.Unlock()
	h := &harness{bin: abs, self: self, tmp: tmp}
	if nm, err := filepath.Abs(nodeModules); err == nil {
		if _, err := os.Stat(filepath.Join(nm, "openai")); err == nil {
			h.nodeModules = nm
		}
	}
	h.keys = h.probeKeys()
	return h, nil
}

// probeKeys asks live which of newKeys it knows.
func (h *harness) probeKeys() keyReport {
	o := stackOpts{optional: newKeys}
	ports := []int{1, 2, 3, 4, 5}
	path := filepath.Join(h.tmp, "probe-keys.yaml")
	refused, err := h.check(path, o, ports, nil)
	var kr keyReport
	if err != nil {
		kr.note = "--check failed: " + err.Error()
	}
	for _, k := range newKeys {
		name := k.path
		if alt, ok := strings.CutPrefix(k.path, "models[0]."); ok {
			// The model-level spelling of a top-level key: reported only
			// when live takes it there instead.
			if !refused[alt] || refused[k.path] {
				continue
			}
			kr.refused = slices.DeleteFunc(kr.refused, func(s string) bool { return s == alt })
			name = k.path
		}
		if refused[k.path] {
			kr.refused = append(kr.refused, name)
		} else {
			kr.accepted = append(kr.accepted, name)
		}
	}
	return kr
}

// stackOpts shapes one generated configuration.
type stackOpts struct {
	top         []string // fixed top-level YAML lines
	model       []string // fixed lines of the model
	optional    []optKey // new keys, dropped when live refuses them
	decisionLog string   // path; "" = off
	sample      float64
	engineArgs  []string
}

func (o stackOpts) yaml(ports []int, drop map[string]bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\n", ports[0], ports[1])
	for _, l := range o.top {
		b.WriteString(l + "\n")
	}
	var modelOpt []string
	for _, k := range o.optional {
		if drop[k.path] {
			continue
		}
		if name, ok := strings.CutPrefix(k.path, "models[0]."); ok {
			modelOpt = append(modelOpt, name+": "+k.value)
			continue
		}
		fmt.Fprintf(&b, "%s: %s\n", k.path, k.value)
	}
	if o.decisionLog != "" {
		fmt.Fprintf(&b, "decision_log: {path: %q, sample: %g}\n", o.decisionLog, o.sample)
	}
	b.WriteString("models:\n  - name: inferrail-sim\n")
	for _, l := range append(slices.Clone(o.model), modelOpt...) {
		b.WriteString("    " + l + "\n")
	}
	b.WriteString("    replicas:\n")
	for i, p := range ports[2:] {
		fmt.Fprintf(&b, "      - {name: %s, url: \"http://127.0.0.1:%d\"}\n", replicaNames[i], p)
	}
	return b.String()
}

var replicaNames = []string{"a", "b", "c"}

var unknownField = regexp.MustCompile(`([A-Za-z0-9_.\[\]]+): unknown field`)

// check writes o's configuration to path and runs live --check on it,
// dropping every optional key live calls unknown until it passes. It
// returns the refused keys.
func (h *harness) check(path string, o stackOpts, ports []int, drop map[string]bool) (map[string]bool, error) {
	if drop == nil {
		drop = map[string]bool{}
	}
	for range 3 {
		if err := os.WriteFile(path, []byte(o.yaml(ports, drop)), 0o644); err != nil {
			return drop, err
		}
		out, err := exec.Command(h.bin, "live", "--config", path, "--check").CombinedOutput()
		if err == nil {
			return drop, nil
		}
		found := false
		for _, m := range unknownField.FindAllStringSubmatch(string(out), -1) {
			for _, k := range o.optional {
				if k.path == m[1] && !drop[k.path] {
					drop[k.path], found = true, true
				}
			}
		}
		if !found {
			return drop, fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return drop, errors.New("live --check still fails")
}

// stack is three engines (replicas a, b, c) and the proxy in front.
type stack struct {
	engines []*proc
	live    *proc
	base    string // http://127.0.0.1:port
	admin   string
	addr    string // 127.0.0.1:port
	config  string
	refused []string // optional keys live refused
}

// engine returns the engine serving replica name.
func (s *stack) engine(name string) *proc {
	if i := slices.Index(replicaNames, name); i >= 0 {
		return s.engines[i]
	}
	return nil
}

// freePorts reserves n distinct free ports on 127.0.0.1.
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
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startStack starts the engines and the proxy and waits until the proxy
// answers and has scraped every engine once.
func (h *harness) startStack(tag string, o stackOpts) (*stack, error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errStack, err)
	}
	dir := filepath.Join(h.tmp, tag)
	os.MkdirAll(dir, 0o755)
	cfg := filepath.Join(dir, "live.yaml")
	drop, err := h.check(cfg, o, ports, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: live --check: %v", errStack, err)
	}
	s := &stack{
		base: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), config: cfg,
	}
	for k := range drop {
		s.refused = append(s.refused, k)
	}
	slices.Sort(s.refused)
	for i, p := range ports[2:] {
		args := append([]string{"engine", "--port", fmt.Sprint(p)}, o.engineArgs...)
		e, err := spawn("engine-"+replicaNames[i], filepath.Join(dir, "engine-"+replicaNames[i]+".log"), nil, nil, nil, h.bin, args...)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errStack, err)
		}
		s.engines = append(s.engines, e)
	}
	for i, p := range ports[2:] {
		if err := waitStatus(fmt.Sprintf("http://127.0.0.1:%d/health", p), 10*time.Second); err != nil {
			return nil, fmt.Errorf("%w: engine %s: %v (%s)", errStack, replicaNames[i], err, tail(s.engines[i].log))
		}
	}
	l, err := spawn("live", filepath.Join(dir, "live.log"), nil, nil, nil, h.bin, "live", "--config", cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errStack, err)
	}
	s.live = l
	if err := waitStatus(s.base+"/health", 10*time.Second); err != nil {
		return nil, fmt.Errorf("%w: live: %v (%s)", errStack, err, tail(l.log))
	}
	// The first scrapes: kv admission knows each engine's capacity.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		reps, err := s.replicas()
		if err == nil && len(reps) == 3 && !slices.ContainsFunc(reps, func(r replicaView) bool { return r.CapacityBlocks <= 0 }) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, nil
}

func (s *stack) stop() {
	s.live.stop(time.Second)
	for _, e := range s.engines {
		e.stop(time.Second)
	}
}

// replicaView is the part of the admin /replicas answer the harness reads.
type replicaView struct {
	Replica        string `json:"replica"`
	Healthy        bool   `json:"healthy"`
	InFlight       int    `json:"in_flight"`
	Pending        int    `json:"pending"`
	CapacityBlocks int    `json:"capacity_blocks"`
	Queued         int    `json:"model_queued"`
	Running        int    `json:"engine_running"`
	Waiting        int    `json:"engine_waiting"`
}

func (s *stack) replicas() ([]replicaView, error) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(s.admin + "/replicas")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []replicaView
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out, err
}

// waitStatus polls url until it answers 200.
func waitStatus(url string, timeout time.Duration) error {
	c := http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: %s after %s", url, last, timeout)
}

// tail is the end of a log file, on one line.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// probePath picks the readiness path of base: /readyz, or /health when
// /readyz is 404, or the first of more that is not 404.
func probePath(base string, more ...string) string {
	c := http.Client{Timeout: time.Second}
	paths := append([]string{"/readyz", "/health"}, more...)
	for _, p := range paths {
		resp, err := c.Get(base + p)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			return p
		}
	}
	return paths[0]
}

// getStatus is one GET on a fresh connection: the status, or 0 and the
// error.
func getStatus(url string, timeout time.Duration) (int, time.Duration, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := http.Client{Timeout: timeout, Transport: tr}
	t0 := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return 0, time.Since(t0), err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, time.Since(t0), nil
}
