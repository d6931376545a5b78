package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of Config.Mix.
const (
	// MaxMixClasses bounds the number of classes of a mix.
	MaxMixClasses = 64
	// MaxTenantLen bounds a class's tenant, in bytes.
	MaxTenantLen = 128
	// MaxPriority bounds a class's priority; priorities are in
	// [0, MaxPriority].
	MaxPriority = 1000
)

// MixClass is one tenant/priority class of Config.Mix.
type MixClass struct {
	// Tenant is the fairness flow of the class's requests (an OpenAI
	// `user`-like id, at most MaxTenantLen bytes of UTF-8); "" for none.
	Tenant string `yaml:"tenant"`
	// Priority is the class's scheduling priority in [0, MaxPriority];
	// higher is more important.
	Priority int `yaml:"priority"`
	// Share is the class's weight, finite and > 0. Shares are normalised
	// by their sum, so they need not add up to 1: {0.7, 0.3} and {7, 3}
	// are the same mix.
	Share float64 `yaml:"share"`
}

// mixClassErrors checks one class, calling fail with the field ("tenant",
// "priority" or "share") of each problem.
func mixClassErrors(m MixClass, fail func(field, format string, args ...any)) {
	if len(m.Tenant) > MaxTenantLen {
		fail("tenant", "must be at most %d bytes, got %d", MaxTenantLen, len(m.Tenant))
	} else if !utf8.ValidString(m.Tenant) {
		fail("tenant", "must be valid UTF-8, got %q", m.Tenant)
	}
	if m.Priority < 0 || m.Priority > MaxPriority {
		fail("priority", "must be in [0, %d], got %d", MaxPriority, m.Priority)
	}
	switch {
	case math.IsInf(m.Share, 0):
		fail("share", "must be finite, got %v", m.Share)
	case !(m.Share > 0): // also NaN
		fail("share", "must be positive, got %v", m.Share)
	}
}

// mix checks Config.Mix.
func (k *checker) mix(classes []MixClass) {
	if len(classes) > MaxMixClasses {
		k.fail("mix", "must have at most %d classes, got %d", MaxMixClasses, len(classes))
		return
	}
	for i, m := range classes {
		mixClassErrors(m, func(field, format string, args ...any) {
			k.fail(fmt.Sprintf("mix[%d].%s", i, field), format, args...)
		})
		for j := range i {
			if classes[j].Tenant == m.Tenant && classes[j].Priority == m.Priority {
				k.fail(fmt.Sprintf("mix[%d]", i), "duplicates mix[%d] (tenant %q, priority %d)", j, m.Tenant, m.Priority)
				break
			}
		}
	}
}

// ParseMix parses a mix given as a command-line flag: comma-separated
// items tenant:priority:share, such as "a:0:0.7,b:1:0.3". The last two
// colon-separated fields are the priority and the share, so a tenant may
// contain colons (not commas); spaces around items and fields are ignored
// and the tenant may be empty (":5:0.1" is an untenanted class of priority
// 5). The empty string is no mix (nil). Each class is checked as
// Config.Validate checks Config.Mix, and an error names the bad item (from
// 1) and field.
func ParseMix(s string) ([]MixClass, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	n := strings.Count(s, ",") + 1
	if n > MaxMixClasses {
		return nil, fmt.Errorf("mix: at most %d classes, got %d", MaxMixClasses, n)
	}
	out := make([]MixClass, 0, n)
	for i, item := range strings.Split(s, ",") {
		m, err := parseMixItem(strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("mix item %d (%q): %w", i+1, item, err)
		}
		for j, o := range out {
			if o.Tenant == m.Tenant && o.Priority == m.Priority {
				return nil, fmt.Errorf("mix item %d (%q): duplicates item %d (tenant %q, priority %d)", i+1, item, j+1, m.Tenant, m.Priority)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// parseMixItem parses and checks one tenant:priority:share.
func parseMixItem(item string) (MixClass, error) {
	if item == "" {
		return MixClass{}, fmt.Errorf("empty, want tenant:priority:share")
	}
	j := strings.LastIndexByte(item, ':')
	if j < 0 {
		return MixClass{}, fmt.Errorf("want tenant:priority:share")
	}
	i := strings.LastIndexByte(item[:j], ':')
	if i < 0 {
		return MixClass{}, fmt.Errorf("want tenant:priority:share, got two fields")
	}
	tenant := strings.TrimSpace(item[:i])
	ps := strings.TrimSpace(item[i+1 : j])
	ss := strings.TrimSpace(item[j+1:])
	prio, err := strconv.Atoi(ps)
	if err != nil {
		return MixClass{}, fmt.Errorf("priority: %q is not an integer in [0, %d]", ps, MaxPriority)
	}
	share, err := strconv.ParseFloat(ss, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) { // out of range: reported below
		return MixClass{}, fmt.Errorf("share: %q is not a number", ss)
	}
	m := MixClass{Tenant: tenant, Priority: prio, Share: share}
	var first error
	mixClassErrors(m, func(field, format string, args ...any) {
		if first == nil {
			first = fmt.Errorf("%s: "+format, append([]any{field}, args...)...)
		}
	})
	return m, first
}

// mixer draws each request's (or session's) class of Config.Mix from its
// own random stream, so that a mix never changes another stream's draws.
// The zero mixer (no mix) draws nothing and assigns tenant "" and
// priority 0.
type mixer struct {
	r       *rand.Rand
	cdf     []float64 // normalised cumulative shares; cdf[len-1] == 1
	classes []MixClass
}

// newMixer returns the mixer of c.Mix (validated); its stream is
// "<workload>/mix".
func newMixer(c *Config) mixer {
	if len(c.Mix) == 0 {
		return mixer{}
	}
	// Scale by the largest share first so the sum cannot overflow.
	top := 0.0
	for _, m := range c.Mix {
		top = max(top, m.Share)
	}
	cdf := make([]float64, len(c.Mix))
	sum := 0.0
	for i, m := range c.Mix {
		sum += m.Share / top
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[len(cdf)-1] = 1
	return mixer{r: newRand(c.Seed, c.Workload+"/mix"), cdf: cdf, classes: slices.Clone(c.Mix)}
}

// draw returns the next class's tenant and priority, or "" and 0 without a
// mix.
func (m *mixer) draw() (string, int) {
	if len(m.classes) == 0 {
		return "", 0
	}
	u := m.r.Float64()
	lo, hi := 0, len(m.cdf)-1
	for lo < hi { // first i with cdf[i] > u
		mid := int(uint(lo+hi) >> 1)
		if m.cdf[mid] > u {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	c := &m.classes[lo]
	return c.Tenant, c.Priority
}

// apply draws r's class into r.Tenant and r.Priority; without a mix it
// leaves them "" and 0.
func (m *mixer) apply(r *Request) {
	if len(m.classes) != 0 {
		r.Tenant, r.Priority = m.draw()
	}
}
