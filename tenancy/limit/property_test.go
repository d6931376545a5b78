package limit

import (
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"pgregory.net/rapid"
)

// The reference model: the same token buckets in exact rational arithmetic,
// on an integer clock in microseconds. It decides every request the
// implementation decides; where the two may differ by rounding (a fit
// within 1e-6·L of the limit) the model follows the implementation, and
// everywhere else they must agree. On the model's exact state it then
// checks the invariants stated in doc.go:
//
//   - after every admission, each bucket's exact level ≤ L·(1 + 1e-6);
//   - requests: for any two admissions i ≤ j on a bucket, the admissions in
//     [t_i, t_j] number at most L + (t_j − t_i)·L/W (+1e-6·L);
//   - leases: at every admission, live leases ≤ max_concurrency, and Renew
//     reports a lost lease exactly when the model's had expired.
type model struct {
	w       int64 // µs
	ttl     int64 // µs
	now     int64 // µs
	buckets map[string]*modelBucket
}

type modelBucket struct {
	r, t   *big.Rat
	ts     int64
	leases map[int]int64 // reservation index → expiry µs
	admits []int64       // times of admissions charged on RPM
}

func (m *model) bucket(id string) *modelBucket {
	b := m.buckets[id]
	if b == nil {
		b = &modelBucket{r: new(big.Rat), t: new(big.Rat), ts: m.now, leases: map[int]int64{}}
		m.buckets[id] = b
	}
	return b
}

// drained is the exact level after the time since ts, for limit L.
func (m *model) drained(level *big.Rat, ts int64, limit int) *big.Rat {
	el := m.now - ts
	if el <= 0 || level.Sign() <= 0 {
		return new(big.Rat).Set(level)
	}
	d := new(big.Rat).SetFrac64(el*int64(limit), m.w)
	out := new(big.Rat).Sub(level, d)
	if out.Sign() < 0 {
		out.SetInt64(0)
	}
	return out
}

// fit compares level + cost with limit: +1 fits clearly, −1 refuses
// clearly, 0 within rounding of the boundary.
func fit(level *big.Rat, cost int, limit int) int {
	sum := new(big.Rat).Add(level, new(big.Rat).SetInt64(int64(cost)))
	gap := new(big.Rat).Sub(new(big.Rat).SetInt64(int64(limit)), sum)
	g, _ := gap.Float64()
	if g > 1e-6*float64(limit) {
		return 1
	}
	if g < -1e-6*float64(limit) {
		return -1
	}
	return 0
}

type propRes struct {
	d       Decision
	req     Request
	idx     int
	done    bool
	charged int
}

func runProperty(t *rapid.T, l Limiter, advance func(time.Duration), w, ttl time.Duration) {
	m := &model{w: w.Microseconds(), ttl: ttl.Microseconds(), buckets: map[string]*modelBucket{}}
	lim := func(name string, rpmMax, tpmMax, concMax int) Limits {
		return Limits{
			RPM:            rapid.IntRange(0, rpmMax).Draw(t, name+".rpm"),
			TPM:            rapid.IntRange(0, tpmMax).Draw(t, name+".tpm"),
			MaxConcurrency: rapid.IntRange(0, concMax).Draw(t, name+".conc"),
		}
	}
	key := Bucket{ID: "key", Limits: lim("key", 20, 3000, 4)}
	km := Bucket{ID: "key:model", Limits: lim("km", 10, 2000, 3)}
	global := Bucket{ID: "global", Limits: lim("global", 40, 6000, 6)}
	shapes := [][]Bucket{{key}, {key, km}, {key, km, global}, {global, km}}
	var held []*propRes
	n := 0

	for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
		switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
		case op <= 2: // advance
			us := rapid.Int64Range(0, m.w/8).Draw(t, "us")
			if rapid.IntRange(0, 9).Draw(t, "long") == 0 {
				us = rapid.Int64Range(0, 2*m.w).Draw(t, "longus")
			}
			advance(time.Duration(us) * time.Microsecond)
			m.now += us
		case op <= 6: // reserve
			bs := shapes[rapid.IntRange(0, len(shapes)-1).Draw(t, "shape")]
			tokens := rapid.IntRange(0, 400).Draw(t, "tokens")
			if rapid.IntRange(0, 9).Draw(t, "big") == 0 {
				tokens = rapid.IntRange(0, 3000).Draw(t, "bigtokens")
			}
			req := Request{Buckets: bs, Tokens: tokens}
			d, err := l.Reserve(bg, req)
			if err != nil {
				t.Fatalf("step %d: reserve: %v", step, err)
			}
			checkReserve(t, m, req, d, n, step)
			if d.Allowed {
				held = append(held, &propRes{d: d, req: req, idx: n, charged: tokens})
			}
			n++
		case op <= 8: // finish
			if len(held) == 0 {
				continue
			}
			i := rapid.IntRange(0, len(held)-1).Draw(t, "which")
			p := held[i]
			used := UsageUnknown
			if rapid.Bool().Draw(t, "known") {
				used = rapid.IntRange(0, 2*p.charged+50).Draw(t, "used")
			}
			if err := l.Finish(bg, p.d.Reservation, used); err != nil {
				t.Fatalf("step %d: finish: %v", step, err)
			}
			if !p.done {
				modelFinish(m, p, used)
			}
			p.done = true
			if rapid.Bool().Draw(t, "drop") {
				held = append(held[:i], held[i+1:]...)
			}
		default: // renew
			if len(held) == 0 {
				continue
			}
			p := held[rapid.IntRange(0, len(held)-1).Draw(t, "which")]
			err := l.Renew(bg, p.d.Reservation)
			lost := modelRenew(m, p)
			if lost != errors.Is(err, ErrLeaseLost) || (err != nil && !errors.Is(err, ErrLeaseLost)) {
				t.Fatalf("step %d: renew of reservation %d: %v, model lost=%v", step, p.idx, err, lost)
			}
		}
	}
	// requests: the pairwise bound on every bucket's admissions
	for _, b := range []Bucket{key, km, global} {
		mb := m.buckets[b.ID]
		if mb == nil || b.RPM == 0 {
			continue
		}
		L := float64(b.RPM)
		for i := range mb.admits {
			for j := i; j < len(mb.admits); j++ {
				bound := L + float64(mb.admits[j]-mb.admits[i])*L/float64(m.w) + 1e-6*L
				if float64(j-i+1) > bound {
					t.Fatalf("bucket %s: %d admissions in %dµs, bound %.4f", b.ID, j-i+1, mb.admits[j]-mb.admits[i], bound)
				}
			}
		}
	}
}

func checkReserve(t *rapid.T, m *model, req Request, d Decision, idx, step int) {
	for _, b := range req.Buckets {
		if b.TPM > 0 && req.Tokens > b.TPM {
			if d.Allowed || d.Reason != ReasonTooLarge {
				t.Fatalf("step %d: %d tokens over %s's TPM %d: %+v", step, req.Tokens, b.ID, b.TPM, d)
			}
			return
		}
	}
	verdict := 1 // 1 admit, -1 refuse, 0 either
	reasons := map[Reason]bool{}
	lr := make([]*big.Rat, len(req.Buckets))
	lt := make([]*big.Rat, len(req.Buckets))
	for i, b := range req.Buckets {
		mb := m.bucket(b.ID)
		lr[i], lt[i] = new(big.Rat), new(big.Rat)
		if b.RPM > 0 {
			lr[i] = m.drained(mb.r, mb.ts, b.RPM)
		}
		if b.TPM > 0 {
			lt[i] = m.drained(mb.t, mb.ts, b.TPM)
		}
		for _, c := range []struct {
			on     bool
			level  *big.Rat
			cost   int
			limit  int
			reason Reason
		}{{b.RPM > 0, lr[i], 1, b.RPM, ReasonRPM}, {b.TPM > 0, lt[i], req.Tokens, b.TPM, ReasonTPM}} {
			if !c.on {
				continue
			}
			switch fit(c.level, c.cost, c.limit) {
			case -1:
				verdict = -1
				reasons[c.reason] = true
			case 0:
				if verdict == 1 {
					verdict = 0
				}
				reasons[c.reason] = true
			}
		}
		if b.MaxConcurrency > 0 {
			live := 0
			for _, exp := range mb.leases {
				if exp > m.now {
					live++
				}
			}
			if live+1 > b.MaxConcurrency {
				verdict = -1
				reasons[ReasonConcurrency] = true
			}
		}
	}
	if (verdict == 1 && !d.Allowed) || (verdict == -1 && d.Allowed) {
		t.Fatalf("step %d: model verdict %d, limiter %+v", step, verdict, d)
	}
	if !d.Allowed {
		if !reasons[d.Reason] {
			t.Fatalf("step %d: refused for %q, model's refusing reasons %v", step, d.Reason, reasons)
		}
		return
	}
	// admitted: charge the model, then check invariants 1 and 4
	for i, b := range req.Buckets {
		mb := m.bucket(b.ID)
		if b.RPM > 0 {
			lr[i].Add(lr[i], big.NewRat(1, 1))
			mb.admits = append(mb.admits, m.now)
		}
		if b.TPM > 0 {
			lt[i].Add(lt[i], big.NewRat(int64(req.Tokens), 1))
		}
		mb.r, mb.t, mb.ts = lr[i], lt[i], m.now
		for _, c := range []struct {
			level *big.Rat
			limit int
			name  string
		}{{lr[i], b.RPM, "rpm"}, {lt[i], b.TPM, "tpm"}} {
			if c.limit == 0 {
				continue
			}
			if f, _ := c.level.Float64(); f > float64(c.limit)*(1+1e-6) {
				t.Fatalf("step %d: bucket %s %s level %.6f > limit %d after an admission", step, b.ID, c.name, f, c.limit)
			}
		}
		if b.MaxConcurrency > 0 {
			for k, exp := range mb.leases {
				if exp <= m.now {
					delete(mb.leases, k)
				}
			}
			mb.leases[idx] = m.now + m.ttl
			if len(mb.leases) > b.MaxConcurrency {
				t.Fatalf("step %d: %d live leases on %s, max %d", step, len(mb.leases), b.ID, b.MaxConcurrency)
			}
		}
	}
	// the header bucket's remaining, within one unit of the exact value
	b0 := req.Buckets[0]
	if b0.RPM > 0 {
		exact, _ := new(big.Rat).Sub(big.NewRat(int64(b0.RPM), 1), lr[0]).Float64()
		if diff := float64(d.Requests.Remaining) - exact; diff > 1e-6 || diff < -1-1e-6 {
			t.Fatalf("step %d: remaining requests %d, exact %.6f", step, d.Requests.Remaining, exact)
		}
	}
}

func modelFinish(m *model, p *propRes, used int) {
	delta := 0
	if used >= 0 {
		delta = used - p.charged
	}
	for _, b := range p.req.Buckets {
		mb := m.bucket(b.ID)
		if b.MaxConcurrency > 0 {
			delete(mb.leases, p.idx)
		}
		if b.TPM == 0 || delta == 0 {
			continue
		}
		r := new(big.Rat)
		if b.RPM > 0 {
			r = m.drained(mb.r, mb.ts, b.RPM)
		}
		tk := m.drained(mb.t, mb.ts, b.TPM)
		tk.Add(tk, big.NewRat(int64(delta), 1))
		if tk.Sign() < 0 {
			tk.SetInt64(0)
		}
		mb.r, mb.t, mb.ts = r, tk, m.now
	}
}

func modelRenew(m *model, p *propRes) (lost bool) {
	if p.done {
		return false
	}
	for _, b := range p.req.Buckets {
		if b.MaxConcurrency == 0 {
			continue
		}
		mb := m.bucket(b.ID)
		exp, ok := mb.leases[p.idx]
		if !ok || exp <= m.now {
			delete(mb.leases, p.idx)
			lost = true
			continue
		}
		mb.leases[p.idx] = m.now + m.ttl
	}
	return lost
}

func TestPropertyLocal(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := newFakeClock()
		l, err := NewLocal(Config{Now: clk.Now, LeaseTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		runProperty(t, l, clk.Advance, time.Minute, 3*time.Second)
	})
}

// The same property on the Lua scripts (miniredis: frozen TIME, the clock
// moved by the scripts' offset).
func TestPropertyRedisScripts(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c := newClient(t, "tcp", m.Addr())
	checks := 0
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		r := newRedisLimiter(t, c, RedisConfig{Config: Config{LeaseTTL: 3 * time.Second}, KeyPrefix: fmt.Sprintf("p%d", checks)})
		runProperty(rt, r, r.advance, time.Minute, 3*time.Second)
	})
}
