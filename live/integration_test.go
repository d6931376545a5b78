package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/embed"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// nodeModules is where the OpenAI Node SDK is installed (make node-deps);
// the test is skipped without it or without node.
func nodeModules(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("INFERRAIL_NODE_MODULES")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "node", "node_modules")
	}
	if _, err := os.Stat(filepath.Join(dir, "openai")); err != nil {
		t.Skipf("OpenAI Node SDK not installed in %s: run `make node-deps` (make test does)", dir)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not found")
	}
	abs, _ := filepath.Abs(dir)
	return abs
}

// The official OpenAI Node SDK through the gateway, streaming and not.
func TestOpenAINodeSDKThroughGateway(t *testing.T) {
	abs := nodeModules(t)
	sc := server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true, ResponsesStore: 16}
	g := startGateway(t, testConfig(t, newUpstream(t, sc), newUpstream(t, sc)))
	cmd := exec.Command("node", filepath.Join("..", "engine", "server", "testdata", "openai_sdk.cjs"))
	cmd.Env = append(os.Environ(), "BASE_URL="+g.base, "NODE_PATH="+abs)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("node: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var res struct {
		Models []string `json:"models"`
		Chat   struct {
			Object, Content, Finish string
		} `json:"chat"`
		ChatStream struct {
			Text, Finish string
			Chunks       int
		} `json:"chatStream"`
		CompletionStream struct {
			Text   string
			Chunks int
		} `json:"completionStream"`
		Error *struct {
			Status int `json:"status"`
		} `json:"error"`
		RequestID struct{ Header, ID string } `json:"requestId"`
		Embedding struct {
			Object               string
			N, Dim, PromptTokens int
		} `json:"embedding"`
		// The Responses API: the continuation reaches the replica that
		// holds the first response, or it is 404.
		Response struct {
			ID, Status string
		} `json:"response"`
		ResponseStream struct {
			Last  string
			Usage *struct {
				OutputTokens int `json:"output_tokens"`
			}
		} `json:"responseStream"`
		ResponseNext struct {
			Previous string
			Cached   int
		} `json:"responseNext"`
		Retrieved  string `json:"retrieved"`
		Background struct {
			Status, Cancelled string
		} `json:"background"`
		// Left after its first event and resumed from the next: the
		// replica that holds it is found, and streams it to its end.
		BackgroundStream struct {
			Last                                    string
			FirstSeq, ResumedFirstSeq, OutputTokens int
		} `json:"backgroundStream"`
		// n = 2, whole and through the SDK's stream helper.
		ChatN, ChatNStream struct {
			Choices []struct {
				Index, Words int
				Finish       string
			}
			Distinct bool
			Usage    struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Chat.Object != "chat.completion" || res.Chat.Finish != "length" || res.ChatStream.Chunks < 3 || len(strings.Fields(res.ChatStream.Text)) != 6 || res.CompletionStream.Chunks < 3 || len(strings.Fields(res.CompletionStream.Text)) != 7 ||
		res.Error == nil || res.Error.Status != 404 || res.RequestID.Header != "sdk-1" || res.RequestID.ID == "chatcmpl-sdk-1" || !strings.HasPrefix(res.RequestID.ID, "chatcmpl-") {
		t.Fatalf("through the gateway: %s", out)
	}
	if e := res.Embedding; e.Object != "list" || e.N != 1 || e.Dim != embed.DefaultDim || e.PromptTokens != 3 {
		t.Fatalf("embeddings through the gateway: %+v", e)
	}
	if res.Response.Status != "incomplete" || res.ResponseStream.Last != "response.completed" || res.ResponseStream.Usage == nil || res.ResponseStream.Usage.OutputTokens != 6 ||
		res.ResponseNext.Previous != res.Response.ID || res.ResponseNext.Cached == 0 || res.Retrieved != res.Response.ID ||
		res.Background.Status != "queued" || res.Background.Cancelled != "cancelled" ||
		res.BackgroundStream.ResumedFirstSeq != res.BackgroundStream.FirstSeq+1 || res.BackgroundStream.Last != "response.completed" || res.BackgroundStream.OutputTokens != 200 {
		t.Fatalf("the Responses API through the gateway: %s", out)
	}
	for _, c := range [][]byte{mustJSON(t, res.ChatN), mustJSON(t, res.ChatNStream)} {
		if !bytes.Equal(c, []byte(`{"Choices":[{"Index":0,"Words":4,"Finish":"length"},{"Index":1,"Words":4,"Finish":"length"}],"Distinct":true,"Usage":{"completion_tokens":8}}`)) {
			t.Fatalf("n = 2 through the gateway: %s", c)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The decision log gets sampled decisions as JSON lines, without prompts.
func TestDecisionLog(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	o := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	o.DecisionLog.Sample = 1
	g := startGatewayDeps(t, o, Deps{DecisionLog: writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })})
	secret := words(777, 20)
	for range 5 {
		if _, _, err := g.complete(context.Background(), secret, 2); err != nil {
			t.Fatal(err)
		}
	}
	g.stop()
	mu.Lock()
	defer mu.Unlock()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 || strings.Contains(buf.String(), strings.Fields(secret)[0]) {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	var e decisionEntry
	if err := json.Unmarshal([]byte(lines[4]), &e); err != nil || e.Replica != "a" || e.Prompt != 20 || !e.Tokenized || e.Predicted != 16 {
		t.Fatalf("entry %+v (%v)", e, err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// With the event-fed index, the engines' KV events (over ZMQ, hashed their
// own way) reach the router's index under the gateway's own hashes, so a
// prompt stored on one engine is predicted there: with the engines binding
// (the default), and with the proxy binding (kv_events_bind) and the
// engines' publishers connecting to it, as vLLM's does when its endpoint
// has no "*".
func TestEventFedIndex(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(map[bool]string{false: "engines bind", true: "proxy binds"}[bind], func(t *testing.T) { testEventFedIndex(t, bind) })
	}
}

// freeTCPPort returns a port nothing listens on now.
func freeTCPPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// publishingEngine starts an engine of ec whose KV events go out through a
// ZMQ publisher of kc.
func publishingEngine(t *testing.T, ec engine.Config, kc kvevents.Config) (*upstream, *kvevents.Publisher) {
	return publishingEngineAt(t, "127.0.0.1:0", ec, kc)
}

// publishingEngineAt is publishingEngine listening on addr.
func publishingEngineAt(t *testing.T, addr string, ec engine.Config, kc kvevents.Config) (*upstream, *kvevents.Publisher) {
	t.Helper()
	pub, err := kvevents.NewPublisher(context.Background(), kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	cfg := server.Config{Engine: ec}
	cfg.Engine.EnableKVEvents = true
	cfg.KVEvents = func(at time.Time, evs []engine.KVEvent, tokens func(kvblock.Hash) []uint32) {
		pub.Publish(kvevents.Batch{TS: float64(at.UnixNano()) / 1e9, Events: kvevents.FromEngine(evs, tokens)})
	}
	u := &upstream{t: t, cfg: cfg}
	u.start(addr)
	t.Cleanup(u.kill)
	return u, pub
}

// wantRepeatPredicted sends prompt twice and checks that the repeat goes
// where the first went, predicted want cached tokens.
func wantRepeatPredicted(t *testing.T, g *testGateway, prompt, want string) {
	t.Helper()
	resp, _, err := g.complete(context.Background(), prompt, 2)
	if err != nil {
		t.Fatal(err)
	}
	first := resp.Header.Get(HeaderReplica)
	// Long enough for the speculative record to expire would take 2 s; the
	// events confirm it at once instead: the prediction holds.
	time.Sleep(100 * time.Millisecond)
	resp, _, err = g.complete(context.Background(), prompt, 2)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get(HeaderReplica) != first || resp.Header.Get(HeaderPredicted) != want {
		t.Fatalf("repeat went to %s (first %s) predicting %s cached tokens, want %s", resp.Header.Get(HeaderReplica), first, resp.Header.Get(HeaderPredicted), want)
	}
}

func testEventFedIndex(t *testing.T, bind bool) {
	mk := func() (*upstream, string) {
		kc := kvevents.DefaultConfig()
		kc.EnableKVCacheEvents, kc.Endpoint, kc.ForceBind, kc.Topic = true, "tcp://127.0.0.1:0", true, "kv"
		if bind {
			kc.Endpoint, kc.ForceBind = fmt.Sprintf("tcp://127.0.0.1:%d", freeTCPPort(t)), false
		}
		u, pub := publishingEngine(t, testEngineConfig(), kc)
		if bind {
			return u, kc.Endpoint
		}
		return u, pub.Addr()
	}
	ua, ea := mk()
	ub, eb := mk()
	o := testConfig(t, ua, ub)
	o.Models[0].Index = config.IndexEvents
	o.Models[0].Replicas[0].KVEvents, o.Models[0].Replicas[0].KVEventsTopic = ea, "kv"
	o.Models[0].Replicas[1].KVEvents, o.Models[0].Replicas[1].KVEventsTopic = eb, "kv"
	o.Models[0].Replicas[0].KVEventsBind, o.Models[0].Replicas[1].KVEventsBind = bind, bind
	g := startGateway(t, o)
	// Wait for the subscriptions (ZMQ's slow joiner) by sending until both
	// replicas have blocks in the index.
	waitUntil(t, "KV events from both engines", 20*time.Second, func() bool {
		for i := range 4 {
			g.complete(context.Background(), words(3000+i*100, 40), 2)
		}
		time.Sleep(50 * time.Millisecond)
		n := 0
		for _, v := range g.replicaViews() {
			if v.IndexBlocks > 0 {
				n++
			}
		}
		return n == 2
	})
	wantRepeatPredicted(t, g, words(9000, 100), "96")
}

// DNS groups: every address is a replica; a failed lookup keeps the last
// set; an address that disappears leaves rotation.
func TestDNSDiscovery(t *testing.T) {
	a := newUpstream(t, server.Config{Engine: testEngineConfig()})
	b := newUpstream(t, server.Config{Engine: testEngineConfig()})
	hostA, portA, _ := net.SplitHostPort(a.addr)
	_, portB, _ := net.SplitHostPort(b.addr)
	if portA == portB {
		t.Skip("same port")
	}
	// Both upstreams listen on 127.0.0.1 with different ports, while a DNS
	// group has one port: use two groups of one name each.
	res := &fakeResolver{addrs: map[string][]string{"a.test": {hostA}, "b.test": {hostA}}}
	o := testConfig(t)
	o.Models[0].Replicas = nil
	pa, _ := strconv.Atoi(portA)
	pb, _ := strconv.Atoi(portB)
	o.Models[0].DNS = []config.DNSGroup{{Name: "ga", Host: "a.test", Port: pa, Scheme: "http"}, {Name: "gb", Host: "b.test", Port: pb, Scheme: "http"}}
	o.DNSRefresh = 20 * time.Millisecond
	g := startGatewayDeps(t, o, Deps{Resolver: res})
	waitUntil(t, "both groups resolved", 5*time.Second, func() bool { return len(g.replicaViews()) == 2 })
	// Until each group's replica has served (so each has metric series).
	served := map[string]bool{}
	for i := 0; i < 50 && len(served) < 2; i++ {
		resp, _, err := g.complete(context.Background(), words(1+i*20, 10), 2)
		if err != nil {
			t.Fatal(err)
		}
		served[resp.Header.Get(HeaderReplica)[:2]] = true
	}
	if !served["gb"] {
		t.Fatalf("gb's replica never served (%v)", served)
	}
	res.set("b.test", nil, true) // lookups fail: keep the last set
	time.Sleep(100 * time.Millisecond)
	if n := len(g.replicaViews()); n != 2 {
		t.Fatalf("after failed lookups %d replicas, want 2", n)
	}
	res.set("b.test", []string{}, false) // the name now has no address
	waitUntil(t, "gb's replica to leave", 5*time.Second, func() bool { return len(g.replicaViews()) == 1 })
	// Its metric series went with it.
	mfs, _ := g.met.reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" && strings.HasPrefix(l.GetValue(), "gb-") {
					t.Fatalf("%s still has a series of the departed %s", mf.GetName(), l.GetValue())
				}
			}
		}
	}
	for range 10 {
		resp, _, err := g.complete(context.Background(), words(50, 10), 2)
		if err != nil || !strings.HasPrefix(resp.Header.Get(HeaderReplica), "ga-") {
			t.Fatalf("%v %v", resp.Header, err)
		}
	}
}

type fakeResolver struct {
	mu    sync.Mutex
	addrs map[string][]string
	fail  map[string]bool
}

func (r *fakeResolver) set(host string, addrs []string, fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail == nil {
		r.fail = map[string]bool{}
	}
	r.fail[host] = fail
	if !fail {
		r.addrs[host] = addrs
	}
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[host] {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return append([]string(nil), r.addrs[host]...), nil
}
