package netguard

import (
	"strings"
	"testing"
)

// A /proc/net/netstat of Linux 6.1, shortened: the parser takes the
// fields by name, wherever they are.
const netstatSample = `TcpExt: SyncookiesSent SyncookiesRecv ListenOverflows ListenDrops TCPHPHits
TcpExt: 0 0 2312 2318 104
IpExt: InNoRoutes InTruncatedPkts ListenOverflows
IpExt: 0 0 99
`

func TestParseNetstat(t *testing.T) {
	d, err := parseNetstat(strings.NewReader(netstatSample))
	if err != nil {
		t.Fatal(err)
	}
	if d != (ListenDrops{Overflows: 2312, Drops: 2318}) {
		t.Fatalf("parseNetstat = %+v, want 2312 overflows and 2318 drops (TcpExt's, not IpExt's)", d)
	}
	for name, in := range map[string]string{
		"empty":           "",
		"names only":      "TcpExt: ListenOverflows ListenDrops\n",
		"short values":    "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1\n",
		"not a number":    "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 x\n",
		"negative":        "TcpExt: ListenOverflows ListenDrops\nTcpExt: -1 2\n",
		"fields missing":  "TcpExt: SyncookiesSent\nTcpExt: 1\n",
		"other sections":  "IpExt: ListenOverflows ListenDrops\nIpExt: 1 2\n",
		"split by a line": "TcpExt: ListenOverflows ListenDrops\nIpExt: a\nTcpExt: 1 2\n",
	} {
		if d, err := parseNetstat(strings.NewReader(in)); err == nil {
			t.Errorf("%s: parseNetstat = %+v, want an error", name, d)
		}
	}
}

// FuzzParseNetstat: any input gives values or an error, never a panic, and
// values only from a TcpExt pair that names both counters.
func FuzzParseNetstat(f *testing.F) {
	f.Add(netstatSample)
	f.Add("TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 2\n")
	f.Add("TcpExt: a\nTcpExt: b c\n")
	f.Fuzz(func(t *testing.T, in string) {
		d, err := parseNetstat(strings.NewReader(in))
		if err == nil && (!strings.Contains(in, "ListenOverflows") || !strings.Contains(in, "ListenDrops")) {
			t.Fatalf("parseNetstat(%q) = %+v without both names", in, d)
		}
	})
}
