package results

import (
	"strings"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	def := DefaultSLO()
	for _, tc := range []struct {
		in   string
		want SLO
		err  string
	}{
		{"ttft_p99=2s,tpot_p99=100ms", SLO{TTFTP99: 2 * time.Second, TPOTP99: 100 * time.Millisecond}, ""},
		{" tpot_p99 = 50ms ", SLO{TTFTP99: def.TTFTP99, TPOTP99: 50 * time.Millisecond}, ""},
		{"ttft_p99=2s,", SLO{}, "want ttft_p99=DURATION"},
		{"ttft_p99=-1s", SLO{}, "ttft_p99: want a positive duration"},
		{"ttft_p99=soon", SLO{}, "ttft_p99: want a positive duration"},
		{"e2e_p99=2s", SLO{}, `unknown key "e2e_p99"`},
	} {
		got, err := ParseSLO(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseSLO(%q) error %v, want one containing %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseSLO(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseSLO(f *testing.F) {
	f.Add("ttft_p99=2s,tpot_p99=100ms")
	f.Add("=,=")
	f.Fuzz(func(t *testing.T, s string) {
		slo, err := ParseSLO(s)
		if err == nil && slo.Validate() != nil {
			t.Fatalf("ParseSLO(%q) accepted an invalid SLO %+v", s, slo)
		}
	})
}
