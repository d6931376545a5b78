package semcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// Scope is what every entry belongs to and every lookup is confined to:
// a store compares a query only with entries of exactly the same scope,
// so one tenant's answer is never another's, whatever the similarity.
type Scope struct {
	// Tenant is the tenant the answer was computed for: the API key id,
	// or the trusted tenant header (as the exact cache's key uses).
	// Required: there is no shared pool.
	Tenant string
	// Model is the resolved engine model (LoRA adapter included).
	// Required.
	Model string
	// Partition is an exact digest of everything in the request other
	// than the text that is embedded (Split computes it): the system
	// prompt, earlier turns, sampling parameters, tools, stream. Only the
	// last user message is matched by similarity.
	Partition string
}

// maxScopeField bounds each of a scope's strings.
const maxScopeField = 1024

func (s Scope) validate() error {
	switch {
	case s.Tenant == "":
		return fmt.Errorf("%w: no tenant (entries are always scoped to one)", ErrScope)
	case s.Model == "":
		return fmt.Errorf("%w: no model", ErrScope)
	}
	for _, f := range []string{s.Tenant, s.Model, s.Partition} {
		if len(f) > maxScopeField || !utf8.ValidString(f) || strings.IndexByte(f, 0) >= 0 {
			return fmt.Errorf("%w: tenant, model and partition must be UTF-8 without NUL bytes, at most %d bytes each", ErrScope, maxScopeField)
		}
	}
	return nil
}

// Match is the best entry of a scope at or above the threshold.
type Match struct {
	// Answer is the stored answer (the caller's copy).
	Answer []byte
	// Similarity is the cosine similarity of the query and the entry's
	// vector, from -1 to 1.
	Similarity float64
	// StoredAt is when the entry was stored (by the store's clock).
	StoredAt time.Time
}

// Store holds answers by vector within scopes. Implementations are safe
// for concurrent use, and every call checks the scope: a store never
// compares vectors across scopes.
type Store interface {
	// Put stores answer under vec in scope for ttl. A vector the same
	// (similarity above 1-1e-6) as a live entry's of the scope replaces
	// that entry. When the scope holds its maximum of entries, expired
	// ones go first, then the least recently used.
	Put(ctx context.Context, scope Scope, vec []float32, answer []byte, ttl time.Duration) error
	// Nearest returns the live entry of scope most similar to vec, if its
	// similarity is at least threshold (0 < threshold <= 1); a hit counts
	// as a use for the scope's LRU order.
	Nearest(ctx context.Context, scope Scope, vec []float32, threshold float64) (Match, bool, error)
	// Close releases the store's resources.
	Close() error
}

// Errors a store returns (wrapped).
var (
	// ErrScope: a scope without tenant or model, or with a field too long.
	ErrScope = errors.New("semcache: invalid scope")
	// ErrVector: an empty, zero, NaN or infinite vector, or one of
	// another dimension than the scope's (or the table's).
	ErrVector = errors.New("semcache: invalid vector")
	// ErrTooLarge: an answer bigger than the store takes.
	ErrTooLarge = errors.New("semcache: answer too large")
)

// unit returns a copy of v scaled to length 1, or an error naming what is
// wrong with it.
func unit(v []float32) ([]float32, error) {
	if len(v) == 0 {
		return nil, fmt.Errorf("%w: no dimensions", ErrVector)
	}
	var sum float64
	for i, x := range v {
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: value %d is %v", ErrVector, i, x)
		}
		sum += f * f
	}
	if sum == 0 {
		return nil, fmt.Errorf("%w: the zero vector has no direction", ErrVector)
	}
	inv := 1 / math.Sqrt(sum)
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(float64(x) * inv)
	}
	return out, nil
}

func checkThreshold(t float64) error {
	if !(t > 0 && t <= 1) {
		return fmt.Errorf("semcache: threshold %v: must be in (0, 1]", t)
	}
	return nil
}

func checkTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("semcache: ttl %v: must be positive", ttl)
	}
	return nil
}

// sameVector is the similarity above which Put replaces an entry.
const sameVector = 1 - 1e-6

// dot returns the dot product of two vectors of one length.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
