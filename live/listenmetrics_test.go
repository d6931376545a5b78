package live

import (
	"errors"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/netguard"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeListenerStats struct {
	open int
	q    netguard.AcceptQueue
	ok   bool
}

func (f fakeListenerStats) Stats() netguard.Stats { return netguard.Stats{Open: f.open} }
func (f fakeListenerStats) AcceptQueue() (netguard.AcceptQueue, bool) {
	return f.q, f.ok
}

// TestConnCollector: each listener's open connections and accept queue,
// and the namespace's listen overflows, as the listeners and the kernel
// report them; a queue or a counter the system does not report is left
// out, not given as 0.
func TestConnCollector(t *testing.T) {
	c := newConnCollector()
	c.drops = func() (netguard.ListenDrops, error) { return netguard.ListenDrops{Overflows: 12, Drops: 15}, nil }
	c.set("client", fakeListenerStats{open: 3, q: netguard.AcceptQueue{Len: 7, Max: 4096}, ok: true})
	c.set("admin", fakeListenerStats{open: 1})
	want := `
# HELP inferrail_listen_overflows_total ` + help(t, c, "inferrail_listen_overflows_total") + `
# TYPE inferrail_listen_overflows_total counter
inferrail_listen_overflows_total 12
# HELP inferrail_listen_queue ` + help(t, c, "inferrail_listen_queue") + `
# TYPE inferrail_listen_queue gauge
inferrail_listen_queue{listener="client"} 7
# HELP inferrail_listen_queue_max ` + help(t, c, "inferrail_listen_queue_max") + `
# TYPE inferrail_listen_queue_max gauge
inferrail_listen_queue_max{listener="client"} 4096
# HELP inferrail_open_connections Client connections open now, by listener.
# TYPE inferrail_open_connections gauge
inferrail_open_connections{listener="admin"} 1
inferrail_open_connections{listener="client"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	c.drops = func() (netguard.ListenDrops, error) { return netguard.ListenDrops{}, netguard.ErrNoListenDrops }
	if n := testutil.CollectAndCount(c, "inferrail_listen_overflows_total"); n != 0 {
		t.Fatalf("%d overflow series without the kernel's counter, want none", n)
	}
}

// help returns the help text of c's metric called name.
func help(t *testing.T, c prometheus.Collector, name string) string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 8)
	c.Describe(ch)
	close(ch)
	re := regexp.MustCompile(`fqName: "([^"]+)", help: "([^"]*)"`)
	for d := range ch {
		if m := re.FindStringSubmatch(d.String()); m != nil && m[1] == name {
			return m[2]
		}
	}
	t.Fatalf("no metric %s", name)
	return ""
}

// TestServeListenQueueMetrics: a serving gateway's /metrics gives each
// listener's accept queue, its bound the kernel's somaxconn (Go's listen
// asks for as much, and the kernel caps a backlog there), and the namespace's listen overflows (Linux).
func TestServeListenQueueMetrics(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the accept queue and listen overflows are Linux's")
	}
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.DrainDelay = 0
	_, _, admin, stop := startServing(t, c)
	defer stop()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	b, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		t.Fatal(err)
	}
	somaxconn := strings.TrimSpace(string(b))
	for _, line := range []string{
		`inferrail_listen_queue{listener="client"} 0`,
		`inferrail_listen_queue{listener="admin"} 0`,
		`inferrail_listen_queue_max{listener="client"} ` + somaxconn,
		`inferrail_listen_queue_max{listener="admin"} ` + somaxconn,
	} {
		if !strings.Contains(text, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	d, err := netguard.ReadListenDrops()
	if errors.Is(err, netguard.ErrNoListenDrops) {
		t.Skipf("no /proc/net/netstat: %v", err)
	}
	if !strings.Contains(text, "\ninferrail_listen_overflows_total ") {
		t.Errorf("/metrics lacks inferrail_listen_overflows_total (the kernel counts %d)", d.Overflows)
	}
}

func TestTopAddrs(t *testing.T) {
	got := topAddrs([]netguard.AddrCount{{Addr: netip.MustParseAddr("127.0.0.2"), N: 19744}, {N: 12}})
	if want := "127.0.0.2 19744, others 12"; got != want {
		t.Fatalf("topAddrs = %q, want %q", got, want)
	}
}
