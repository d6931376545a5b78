package limit

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"testing"
	"time"
)

// The conformance suite: every implementation passes the same tests. Each
// test gets fresh limiters from the harness and moves their clock with
// advance (synthetic for Local and miniredis; on the real server an offset
// added to the server's TIME, with the real clock also running a little,
// which the tolerances absorb).
var conformance = []struct {
	name string
	run  func(t *testing.T, h harness)
}{
	{"BurstThenRefill", testBurstThenRefill},
	{"RPMWindow", testRPMWindow},
	{"TPMWindow", testTPMWindow},
	{"ReconcileRefund", testReconcileRefund},
	{"ReconcileExtraCharge", testReconcileExtra},
	{"AllOrNothing", testAllOrNothing},
	{"TooLarge", testTooLarge},
	{"ConcurrencyLeases", testConcurrencyLeases},
	{"Headers", testHeaders},
	{"Unlimited", testUnlimited},
	{"LongestWaitWins", testLongestWait},
	{"FinishIdempotent", testFinishIdempotent},
	{"Validation", testValidation},
	{"Context", testContext},
	{"LimitChange", testLimitChange},
	{"BackwardClockStep", testBackwardClockStep},
}

func TestConformance(t *testing.T) {
	suite := func(t *testing.T, h harness) {
		for _, c := range conformance {
			t.Run(c.name, func(t *testing.T) { c.run(t, h) })
		}
	}
	t.Run("local", func(t *testing.T) { suite(t, localHarness()) })
	t.Run("miniredis", func(t *testing.T) { suite(t, miniHarness()) })
	// the real server: started here, so that a missing binary under -short
	// skips this part only
	t.Run("redis", func(t *testing.T) { suite(t, realHarness(t)) })
}

// A client may spend the whole minute at once; then one request comes back
// every W/L, and after W the whole allowance.
func testBurstThenRefill(t *testing.T, h harness) {
	l, advance := h.new(t, Config{})
	req := Request{Buckets: one("k", Limits{RPM: 10})}
	for i := range 10 {
		d := reserve(t, l, req)
		if !d.Allowed {
			t.Fatalf("request %d of the burst refused: %+v", i, d)
		}
		if d.Requests.Remaining != 9-i {
			t.Fatalf("request %d: remaining %d, want %d", i, d.Requests.Remaining, 9-i)
		}
	}
	d := reserve(t, l, req)
	if d.Allowed || d.Reason != ReasonRPM || d.Bucket != "k" {
		t.Fatalf("11th: %+v, want refused rpm by k", d)
	}
	if !near(d.RetryAfter, 6*time.Second, 50*time.Millisecond) {
		t.Fatalf("retry after %v, want 6s (W/L)", d.RetryAfter)
	}
	advance(d.RetryAfter)
	if d := reserve(t, l, req); !d.Allowed {
		t.Fatalf("after RetryAfter: refused %+v", d)
	}
	if d := reserve(t, l, req); d.Allowed {
		t.Fatal("a second request after one emission interval was admitted")
	}
	advance(time.Minute)
	for i := range 10 {
		if d := reserve(t, l, req); !d.Allowed {
			t.Fatalf("after a full window, request %d refused", i)
		}
	}
	if d := reserve(t, l, req); d.Allowed {
		t.Fatal("11th after a full window admitted")
	}
}

// checkPairwise verifies invariant 2 on a history of admissions (time,
// cost): for any i ≤ j, the costs admitted in [t_i, t_j] are at most
// L + (t_j − t_i)·L/W (+ slack).
func checkPairwise(t *testing.T, at []time.Time, cost []float64, limit int, w time.Duration, slack float64) {
	t.Helper()
	L := float64(limit)
	for i := range at {
		sum := 0.0
		for j := i; j < len(at); j++ {
			sum += cost[j]
			bound := L + float64(at[j].Sub(at[i]))*L/float64(w) + slack
			if sum > bound+1e-6*L {
				t.Fatalf("admitted %.0f in [%d, %d] over %v, bound %.3f", sum, i, j, at[j].Sub(at[i]), bound)
			}
		}
	}
}

// windowSums adds costs per aligned window of w from start.
func windowSums(at []time.Time, cost []float64, start time.Time, w time.Duration) []float64 {
	var out []float64
	for i := range at {
		k := int(at[i].Sub(start) / w)
		for len(out) <= k {
			out = append(out, 0)
		}
		out[k] += cost[i]
	}
	return out
}

// Saturating traffic over five windows: the pairwise bound everywhere, and
// at most L+1 per window once the bucket is full (every window but the
// first), on the limiter's own clock.
func testRPMWindow(t *testing.T, h harness) {
	const L = 12
	w := time.Minute
	l, advance := h.new(t, Config{})
	req := Request{Buckets: one("k", Limits{RPM: L})}
	step := w / (4 * L)
	var at []time.Time
	var cost []float64
	var start time.Time
	for s := range 5 * 4 * L {
		for range 3 { // three attempts per step: demand is 12× the limit
			d := reserve(t, l, req)
			if s == 0 && start.IsZero() {
				start = d.At
			}
			if d.Allowed {
				at = append(at, d.At)
				cost = append(cost, 1)
			}
		}
		advance(step)
	}
	checkPairwise(t, at, cost, L, w, 0)
	sums := windowSums(at, cost, start, w)
	if sums[0] > 2*L {
		t.Fatalf("first window %v > 2L", sums[0])
	}
	for k, s := range sums[1:] {
		if s > L+1 {
			t.Fatalf("window %d admitted %v > L+1 = %d", k+1, s, L+1)
		}
	}
	total := float64(len(at))
	span := at[len(at)-1].Sub(at[0])
	if bound := L + float64(span)*L/float64(w); total > bound+1e-6 || total < bound-2 {
		t.Fatalf("admitted %v over %v, want just under %.1f (L + span·L/W)", total, span, bound)
	}
	t.Logf("admitted per window: %v (L=%d); total %v over %v", sums, L, total, span)
}

// Random estimates, saturating: estimates admitted obey the pairwise bound,
// and each full window holds at most TPM plus one request's estimate (plus
// one step's refill).
func testTPMWindow(t *testing.T, h harness) {
	const L = 1000
	w := time.Minute
	l, advance := h.new(t, Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	step := w / 40
	var at []time.Time
	var cost []float64
	var start time.Time
	maxEst := 0
	for s := range 5 * 40 {
		for range 3 {
			est := 20 + rng.IntN(280)
			d := reserve(t, l, Request{Buckets: one("k", Limits{TPM: L}), Tokens: est})
			if start.IsZero() {
				start = d.At
			}
			if d.Allowed {
				at = append(at, d.At)
				cost = append(cost, float64(est))
				maxEst = max(maxEst, est)
				finish(t, l, d, est) // exact estimate: no correction
			} else if d.Reason != ReasonTPM {
				t.Fatalf("refused for %q", d.Reason)
			}
		}
		_ = s
		advance(step)
	}
	checkPairwise(t, at, cost, L, w, 0)
	sums := windowSums(at, cost, start, w)
	stepRefill := float64(L) * float64(step) / float64(w)
	for k, s := range sums[1:] {
		if s > L+float64(maxEst)+stepRefill {
			t.Fatalf("window %d: %v tokens > TPM + max estimate %d + one step %.0f", k+1, s, maxEst, stepRefill)
		}
	}
	t.Logf("tokens per window: %v (TPM %d, max estimate %d)", sums, L, maxEst)
}

func tokensLeft(t *testing.T, l Limiter, id string, lim Limits) Quota {
	t.Helper()
	d := reserve(t, l, Request{Buckets: one(id, lim), Tokens: 0})
	if d.Allowed {
		finish(t, l, d, 0)
	}
	return d.Tokens
}

func testReconcileRefund(t *testing.T, h harness) {
	l, advance := h.new(t, Config{})
	lim := Limits{TPM: 1000}
	d := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 600})
	if !d.Allowed || d.Tokens.Remaining != 400 {
		t.Fatalf("reserve 600: %+v", d)
	}
	if d.Reservation.Tokens() != 600 {
		t.Fatalf("reservation tokens %d", d.Reservation.Tokens())
	}
	finish(t, l, d, 100) // used 100: 500 back
	if q := tokensLeft(t, l, "k", lim); q.Remaining != 900 {
		t.Fatalf("after refund: remaining %d, want 900", q.Remaining)
	}
	// A refund larger than the level (which drained meanwhile) leaves it at
	// 0, not below: the bucket never holds more than one window's allowance.
	d = reserve(t, l, Request{Buckets: one("k", lim), Tokens: 600})
	advance(time.Minute)
	finish(t, l, d, 0)
	a := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 1000})
	if b := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 1}); !a.Allowed || b.Allowed {
		t.Fatalf("after a refund into a drained bucket: 1000 admitted %v, then 1 admitted %v", a.Allowed, b.Allowed)
	}
	// unknown usage keeps the estimate
	finish(t, l, a, UsageUnknown)
	if q := tokensLeft(t, l, "k", lim); q.Remaining != 0 {
		t.Fatalf("after unknown usage: remaining %d, want 0", q.Remaining)
	}
}

// More used than estimated: charged at Finish (no error), into debt, and
// later requests wait until the debt has drained.
func testReconcileExtra(t *testing.T, h harness) {
	l, advance := h.new(t, Config{})
	lim := Limits{TPM: 1000}
	d := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 500})
	if !d.Allowed {
		t.Fatal(d)
	}
	if err := l.Finish(bg, d.Reservation, 1500); err != nil {
		t.Fatalf("an extra charge is never an error: %v", err)
	}
	d = reserve(t, l, Request{Buckets: one("k", lim), Tokens: 0})
	if d.Allowed || d.Reason != ReasonTPM {
		t.Fatalf("in debt (1500/1000): %+v", d)
	}
	if !near(d.RetryAfter, 30*time.Second, 50*time.Millisecond) || d.Tokens.Remaining != 0 || !near(d.Tokens.Reset, 90*time.Second, 50*time.Millisecond) {
		t.Fatalf("debt: retry %v remaining %d reset %v, want 30s 0 90s", d.RetryAfter, d.Tokens.Remaining, d.Tokens.Reset)
	}
	advance(30 * time.Second)
	if d := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 0}); !d.Allowed {
		t.Fatalf("debt drained: refused %+v", d)
	}
	if d := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 1}); d.Allowed {
		t.Fatal("1 token admitted at a full level")
	}
}

// A request refused by one bucket charges none.
func testAllOrNothing(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	key := Bucket{ID: "key", Limits: Limits{RPM: 10, TPM: 1000, MaxConcurrency: 2}}
	both := func(km Limits, tokens int) Request {
		return Request{Buckets: []Bucket{key, {ID: "key:model", Limits: km}}, Tokens: tokens}
	}
	// rpm on key×model
	a := reserve(t, l, both(Limits{RPM: 1}, 10))
	b := reserve(t, l, both(Limits{RPM: 1}, 10))
	if !a.Allowed || b.Allowed || b.Reason != ReasonRPM || b.Bucket != "key:model" {
		t.Fatalf("rpm: a %+v\nb %+v", a, b)
	}
	if b.Requests.Remaining != 9 || b.Tokens.Remaining != 990 {
		t.Fatalf("refusal's headers show the key bucket charged: %+v %+v", b.Requests, b.Tokens)
	}
	finish(t, l, a, 10)
	// tpm on key×model
	c := reserve(t, l, both(Limits{TPM: 100}, 100))
	e := reserve(t, l, both(Limits{TPM: 100}, 100))
	if !c.Allowed || e.Allowed || e.Reason != ReasonTPM {
		t.Fatalf("tpm: c %+v\ne %+v", c, e)
	}
	d := reserve(t, l, Request{Buckets: []Bucket{key}, Tokens: 0})
	if !d.Allowed || d.Requests.Remaining != 7 || d.Tokens.Remaining != 890 {
		t.Fatalf("key bucket after two refusals: %+v %+v (want 7 requests, 890 tokens left)", d.Requests, d.Tokens)
	}
	finish(t, l, d, 0)
	finish(t, l, c, 100)
	// concurrency on key×model: the key's slots are untouched
	f := reserve(t, l, both(Limits{MaxConcurrency: 1}, 0))
	g := reserve(t, l, both(Limits{MaxConcurrency: 1}, 0))
	if !f.Allowed || g.Allowed || g.Reason != ReasonConcurrency || g.Bucket != "key:model" {
		t.Fatalf("concurrency: f %+v\ng %+v", f, g)
	}
	k1 := reserve(t, l, Request{Buckets: []Bucket{key}})
	k2 := reserve(t, l, Request{Buckets: []Bucket{key}})
	if !k1.Allowed || k2.Allowed || k2.Reason != ReasonConcurrency {
		t.Fatalf("key slots: f holds one, k1 the other, k2 refused: %v %+v", k1.Allowed, k2)
	}
}

func testTooLarge(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	lim := Limits{RPM: 5, TPM: 1000}
	d := reserve(t, l, Request{Buckets: []Bucket{{ID: "key", Limits: Limits{TPM: 10000}}, {ID: "km", Limits: lim}}, Tokens: 1001})
	if d.Allowed || d.Reason != ReasonTooLarge || d.Bucket != "km" || d.RetryAfter != 0 || d.Reservation != nil {
		t.Fatalf("too large: %+v", d)
	}
	h2 := http.Header{}
	d.SetHeaders(h2)
	if h2.Get("Retry-After") != "" {
		t.Fatal("too_large has no Retry-After: it would never fit")
	}
	// nothing charged: the whole allowance of both buckets is still there
	a := reserve(t, l, Request{Buckets: []Bucket{{ID: "key", Limits: Limits{TPM: 10000}}, {ID: "km", Limits: lim}}, Tokens: 1000})
	if !a.Allowed || a.Tokens.Remaining != 9000 {
		t.Fatalf("exactly TPM after too_large: %+v", a)
	}
	k := reserve(t, l, Request{Buckets: one("km", lim)})
	if k.Requests.Remaining != 3 {
		t.Fatalf("km rpm remaining %d, want 3 (too_large charged nothing)", k.Requests.Remaining)
	}
}

func testConcurrencyLeases(t *testing.T, h harness) {
	ttl := 10 * time.Second
	l, advance := h.new(t, Config{LeaseTTL: ttl})
	req := Request{Buckets: one("k", Limits{MaxConcurrency: 2})}
	a, b := reserve(t, l, req), reserve(t, l, req)
	if !a.Allowed || !b.Allowed || !a.Reservation.Leased() {
		t.Fatalf("up to the limit: %v %v", a.Allowed, b.Allowed)
	}
	c := reserve(t, l, req)
	if c.Allowed || c.Reason != ReasonConcurrency || c.RetryAfter != time.Second {
		t.Fatalf("over the limit: %+v", c)
	}
	finish(t, l, a, 0)
	d := reserve(t, l, req)
	if !d.Allowed {
		t.Fatal("release did not free a slot")
	}
	if e := reserve(t, l, req); e.Allowed {
		t.Fatal("3 in flight")
	}
	// b's holder crashes (never renews, never finishes); d renews.
	advance(ttl / 2)
	if err := l.Renew(bg, d.Reservation); err != nil {
		t.Fatalf("renew: %v", err)
	}
	advance(ttl/2 + time.Millisecond)
	f := reserve(t, l, req)
	if !f.Allowed {
		t.Fatalf("the crashed holder's slot was not freed within the TTL: %+v", f)
	}
	if g := reserve(t, l, req); g.Allowed {
		t.Fatal("the renewed lease expired")
	}
	if err := l.Renew(bg, b.Reservation); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewing an expired lease: %v, want ErrLeaseLost", err)
	}
	if err := l.Finish(bg, b.Reservation, 0); err != nil {
		t.Fatalf("finishing an expired lease: %v", err)
	}
	if g := reserve(t, l, req); g.Allowed {
		t.Fatal("finishing the expired b freed someone else's slot")
	}
	// Renew after Finish is nothing to do.
	finish(t, l, d, 0)
	if err := l.Renew(bg, d.Reservation); err != nil {
		t.Fatalf("renew after finish: %v", err)
	}
}

func testHeaders(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	lim := Limits{RPM: 10, TPM: 1000}
	req := Request{Buckets: []Bucket{{ID: "key", Limits: lim}, {ID: "global", Limits: Limits{RPM: 1000}}}, Tokens: 100}
	d := reserve(t, l, req)
	if d.Requests.Limit != 10 || d.Requests.Remaining != 9 || !near(d.Requests.Reset, 6*time.Second, time.Millisecond) {
		t.Fatalf("requests quota %+v", d.Requests)
	}
	if d.Tokens.Limit != 1000 || d.Tokens.Remaining != 900 || !near(d.Tokens.Reset, 6*time.Second, time.Millisecond) {
		t.Fatalf("tokens quota %+v", d.Tokens)
	}
	hd := http.Header{}
	d.SetHeaders(hd)
	want := map[string]string{
		"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "6s",
		"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "6s",
		"retry-after": "",
	}
	for k, v := range want {
		if got := hd.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	for range 9 {
		reserve(t, l, Request{Buckets: req.Buckets, Tokens: 1})
	}
	r := reserve(t, l, req)
	if r.Allowed || r.Requests.Remaining != 0 {
		t.Fatalf("11th: %+v", r)
	}
	hd = http.Header{}
	r.SetHeaders(hd)
	if hd.Get("Retry-After") != "6" || r.RetryAfterSeconds() != 6 || hd.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Fatalf("refusal headers %v", hd)
	}
	// ten requests take the whole minute to drain (a real server's clock
	// ran a little between the calls)
	if got := hd.Get("X-Ratelimit-Reset-Requests"); h.exact && got != "1m0s" {
		t.Fatalf("reset-requests %q, want 1m0s", got)
	} else if rd, err := time.ParseDuration(got); err != nil || !near(rd, time.Minute, 100*time.Millisecond) {
		t.Fatalf("reset-requests %q, want about 1m0s", got)
	}
	if got := hd.Get("X-Ratelimit-Remaining-Tokens"); got != "891" {
		t.Fatalf("remaining tokens %q, want 891 (1000 − 100 − 9)", got)
	}
}

func testUnlimited(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	for i := range 200 {
		d := reserve(t, l, Request{Buckets: []Bucket{{ID: "a"}, {ID: "b"}}, Tokens: 1 << 30})
		if !d.Allowed || d.Reservation.Leased() {
			t.Fatalf("request %d: %+v", i, d)
		}
		hd := http.Header{}
		d.SetHeaders(hd)
		if len(hd) != 0 {
			t.Fatalf("headers without limits: %v", hd)
		}
		finish(t, l, d, 5)
	}
	d := reserve(t, l, Request{})
	if !d.Allowed {
		t.Fatal("no buckets: refused")
	}
	finish(t, l, d, 1)
}

// When several buckets refuse, the decision names the one that makes the
// request wait longest.
func testLongestWait(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	bs := []Bucket{{ID: "key", Limits: Limits{RPM: 1}}, {ID: "km", Limits: Limits{TPM: 600}}}
	if d := reserve(t, l, Request{Buckets: bs, Tokens: 600}); !d.Allowed {
		t.Fatal(d)
	}
	d := reserve(t, l, Request{Buckets: bs, Tokens: 60}) // rpm waits 60s, tpm 6s
	if d.Reason != ReasonRPM || d.Bucket != "key" || !near(d.RetryAfter, time.Minute, 50*time.Millisecond) {
		t.Fatalf("longest wait: %+v", d)
	}
	d = reserve(t, l, Request{Buckets: []Bucket{{ID: "key2", Limits: Limits{RPM: 100}}, bs[1]}, Tokens: 60})
	if d.Reason != ReasonTPM || d.Bucket != "km" || !near(d.RetryAfter, 6*time.Second, 50*time.Millisecond) {
		t.Fatalf("tpm only: %+v", d)
	}
}

func testFinishIdempotent(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	lim := Limits{TPM: 1000, MaxConcurrency: 2}
	a := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 600})
	b := reserve(t, l, Request{Buckets: one("k", lim), Tokens: 300})
	finish(t, l, a, 0)
	finish(t, l, a, 0)
	if !a.Reservation.Finished() {
		t.Fatal("not marked finished")
	}
	if q := tokensLeft(t, l, "k", lim); q.Remaining != 700 {
		t.Fatalf("remaining %d after a double Finish, want 700 (one refund)", q.Remaining)
	}
	c := reserve(t, l, Request{Buckets: one("k", lim)})
	if d := reserve(t, l, Request{Buckets: one("k", lim)}); !c.Allowed || d.Allowed {
		t.Fatalf("slots: b and c hold both; a's double Finish freed nothing extra: c %v d %v", c.Allowed, d.Allowed)
	}
	finish(t, l, b, 300)
	if err := l.Finish(bg, nil, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("finish nil: %v", err)
	}
	if err := l.Renew(bg, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("renew nil: %v", err)
	}
	other, _ := h.new(t, Config{})
	e := reserve(t, other, Request{Buckets: one("k", lim)})
	if err := l.Finish(bg, e.Reservation, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a reservation from another limiter: %v", err)
	}
}

func testValidation(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	for _, c := range []struct {
		req   Request
		field string
		msg   string
	}{
		{Request{Buckets: one("k", Limits{RPM: -1})}, "rpm", `limit: bucket "k": rpm is negative (-1)`},
		{Request{Buckets: one("k", Limits{TPM: -5})}, "tpm", `limit: bucket "k": tpm is negative (-5)`},
		{Request{Buckets: one("k", Limits{MaxConcurrency: -2})}, "max_concurrency", `limit: bucket "k": max_concurrency is negative (-2)`},
		{Request{Buckets: one("k", Limits{TPM: MaxLimit + 1})}, "tpm", ""},
		{Request{Buckets: one("", Limits{})}, "", "limit: invalid: bucket 0: empty id"},
		{Request{Buckets: one("k", Limits{}), Tokens: -1}, "", "limit: invalid: tokens is negative (-1)"},
		{Request{Buckets: []Bucket{{ID: "k"}, {ID: "k"}}}, "", `limit: invalid: bucket "k" named twice`},
		{Request{Buckets: make([]Bucket, MaxBuckets+1)}, "", "limit: invalid: 9 buckets, at most 8"},
	} {
		_, err := l.Reserve(bg, c.req)
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: error %v, want ErrInvalid", c.req, err)
		}
		if c.msg != "" && err.Error() != c.msg {
			t.Errorf("message %q, want %q", err, c.msg)
		}
		var fe *FieldError
		if c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field) {
			t.Errorf("%v: no FieldError naming %s", err, c.field)
		}
	}
	if err := (Limits{RPM: -3}).Validate(); err == nil || err.Error() != "limit: rpm is negative (-3)" {
		t.Errorf("Limits.Validate: %v", err)
	}
}

func testContext(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	ctx, cancel := context.WithCancel(bg)
	req := Request{Buckets: one("k", Limits{MaxConcurrency: 1})}
	d, err := l.Reserve(ctx, req)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	cancel()
	if _, err := l.Reserve(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("reserve on a cancelled context: %v", err)
	}
	// the client went away: Finish must still release the slot
	if err := l.Finish(ctx, d.Reservation, 0); err != nil {
		t.Fatalf("finish on a cancelled context: %v", err)
	}
	if d := reserve(t, l, req); !d.Allowed {
		t.Fatal("slot not released by a Finish on a cancelled context")
	}
}

// A limit changed between requests applies at once, keeping what was used.
func testLimitChange(t *testing.T, h harness) {
	l, _ := h.new(t, Config{})
	for range 5 {
		reserve(t, l, Request{Buckets: one("k", Limits{RPM: 10})})
	}
	if d := reserve(t, l, Request{Buckets: one("k", Limits{RPM: 5})}); d.Allowed {
		t.Fatal("lowered to 5 with 5 used: admitted")
	}
	d := reserve(t, l, Request{Buckets: one("k", Limits{RPM: 20})})
	if !d.Allowed || d.Requests.Remaining != 14 {
		t.Fatalf("raised to 20 with 5 used: %+v", d.Requests)
	}
}

// percentile of durations (tests and benchmarks).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// A clock that steps back (a wall clock set back, a Redis TIME that jumped)
// drains nothing until it is past the last update again, and the update
// after the step does not move the bucket's time back: else the time
// between the step and the last update would drain twice, and more would be
// admitted than the limit allows in real time.
func testBackwardClockStep(t *testing.T, h harness) {
	l, advance := h.new(t, Config{})
	req := Request{Buckets: one("k", Limits{RPM: 10})}
	admitted := 0
	take := func(most int) {
		for range most {
			if !reserve(t, l, req).Allowed {
				return
			}
			admitted++
		}
	}
	take(100) // the burst: 10
	advance(30 * time.Second)
	take(4) // half the window refilled: 4 of the 5 it allows
	advance(-20 * time.Second)
	take(100) // stepped back: nothing drained; the fifth
	advance(20 * time.Second)
	take(100) // back where it was: nothing more
	// 30 s of real time: at most L + L/2 = 15 (a second's slack for a real
	// server's clock, which runs meanwhile).
	if admitted > 15 {
		t.Fatalf("%d admitted over a burst and half a window with a backward clock step, want at most 15", admitted)
	}
}
