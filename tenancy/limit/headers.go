package limit

import (
	"net/http"
	"strconv"
	"time"
)

// The header names OpenAI sends (canonical form).
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"
	HeaderRetryAfter        = "Retry-After"
)

// SetHeaders writes the x-ratelimit-* headers of each limited dimension of
// the header bucket (Requests, Tokens) and, when refused with a known wait,
// Retry-After in whole seconds. Dimensions without a limit write nothing.
func (d *Decision) SetHeaders(h http.Header) {
	setQuota(h, d.Requests, HeaderLimitRequests, HeaderRemainingRequests, HeaderResetRequests)
	setQuota(h, d.Tokens, HeaderLimitTokens, HeaderRemainingTokens, HeaderResetTokens)
	if !d.Allowed && d.RetryAfter > 0 {
		h[HeaderRetryAfter] = []string{strconv.Itoa(d.RetryAfterSeconds())}
	}
}

func setQuota(h http.Header, q Quota, limit, rem, reset string) {
	if q.Limit <= 0 {
		return
	}
	h[limit] = []string{strconv.Itoa(q.Limit)}
	h[rem] = []string{strconv.Itoa(q.Remaining)}
	h[reset] = []string{FormatReset(q.Reset)}
}

// RetryAfterSeconds is RetryAfter rounded up to whole seconds, at least 1
// when there is a wait, 0 when none (too_large, or allowed).
func (d *Decision) RetryAfterSeconds() int {
	if d.RetryAfter <= 0 {
		return 0
	}
	return int((d.RetryAfter + time.Second - 1) / time.Second)
}

// FormatReset writes a duration as OpenAI's x-ratelimit-reset-* do: Go's
// duration syntax rounded up to the millisecond ("17ms", "1.2s", "6m0s",
// "0s").
func FormatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d.String()
}
