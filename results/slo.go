package results

import (
	"fmt"
	"strings"
	"time"
)

// ParseSLO reads an SLO written as "ttft_p99=2s,tpot_p99=100ms" (the
// command line's --slo); a key left out keeps DefaultSLO's value.
func ParseSLO(s string) (SLO, error) {
	slo := DefaultSLO()
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return slo, fmt.Errorf("want ttft_p99=DURATION,tpot_p99=DURATION, got %q", part)
		}
		k = strings.TrimSpace(k)
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d <= 0 {
			return slo, fmt.Errorf("%s: want a positive duration such as 2s or 100ms, got %q", k, v)
		}
		switch k {
		case "ttft_p99":
			slo.TTFTP99 = d
		case "tpot_p99":
			slo.TPOTP99 = d
		default:
			return slo, fmt.Errorf("unknown key %q (allowed: ttft_p99, tpot_p99)", k)
		}
	}
	return slo, nil
}
