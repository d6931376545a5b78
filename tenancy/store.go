package tenancy

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"
)

// Errors of the stores (wrapped: test with errors.Is).
var (
	// ErrNotFound: no key has this id (or it was deleted).
	ErrNotFound = errors.New("not found")
	// ErrExists: a key with this id exists (or existed: ids of deleted
	// keys are not reused).
	ErrExists = errors.New("already exists")
)

// Store keeps keys and usage. Every method takes a context and returns
// wrapped errors; implementations are safe for concurrent use, including
// several processes (gateways) sharing one database.
type Store interface {
	// CreateKey stores a new key and returns it as stored (times
	// normalized; CreatedAt set to now when zero, UpdatedAt to
	// CreatedAt). An invalid key gives an error matching ErrInvalid, an
	// id in use one matching ErrExists.
	CreateKey(ctx context.Context, k Key) (Key, error)
	// GetKey returns the key with this id, or an error matching
	// ErrNotFound.
	GetKey(ctx context.Context, id string) (Key, error)
	// ListKeys returns every key (deleted ones excepted), oldest first,
	// ties by id.
	ListKeys(ctx context.Context) ([]Key, error)
	// UpdateKey applies the patch atomically and returns the key after
	// it, with UpdatedAt set to now (an empty patch changes nothing). A
	// result that fails Validate is refused (ErrInvalid) and nothing
	// changes; an unknown id gives ErrNotFound.
	UpdateKey(ctx context.Context, id string, p KeyPatch) (Key, error)
	// DeleteKey revokes a key: it is no longer found, listed or
	// updatable, and its id is never reused. Its usage rows stay. An
	// unknown (or already deleted) id gives ErrNotFound.
	DeleteKey(ctx context.Context, id string) error
	// AddUsage adds the rows to the stored ones in one transaction:
	// each row's counters are summed into the row of its key, model and
	// hour (created when missing), atomically per row, so several
	// gateways may add at once. Rows are validated first (ErrInvalid);
	// an invalid row writes nothing. Hours are truncated to the UTC hour.
	AddUsage(ctx context.Context, rows []Usage) error
	// Usage returns the rows matching q, ordered by hour, key id, model.
	Usage(ctx context.Context, q UsageQuery) ([]Usage, error)
	// Close releases the store; later calls return errors.
	Close() error
}

// Usage is the metering of one key for one model in one hour: sums over
// the requests it served (never a prompt, nor anything from one).
type Usage struct {
	KeyID string `json:"key_id"`
	Model string `json:"model"`
	// Hour is the start of the hour, in UTC.
	Hour time.Time `json:"hour"`

	Requests     int64 `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	// CachedTokens is the prompt tokens the engine served from its
	// prefix cache.
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Errors counts requests that ended in an error (included in
	// Requests).
	Errors int64 `json:"errors"`

	// Sums, in seconds, of the time queued in the gateway, the time to
	// first token and the whole duration.
	QueueSeconds    float64 `json:"queue_seconds"`
	TTFTSeconds     float64 `json:"ttft_seconds"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// MaxUsageKeyID bounds Usage.KeyID, in bytes. Usage rows are not tied to
// stored keys (they outlive deleted ones), so any short id is accepted; a
// proxy with `auth: none` can meter under a fixed id such as "anonymous".
const MaxUsageKeyID = 64

// UsageQuery selects usage rows: those whose hour overlaps [Since, Until)
// (zero bounds are open), of one key and one model when set.
type UsageQuery struct {
	Since time.Time
	Until time.Time
	KeyID string
	Model string
}

// HourOf returns the start of t's hour in UTC.
func HourOf(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// SinceHour is the first hour a query's Since selects (HourOf(Since)); the
// zero time for an open bound.
func (q UsageQuery) SinceHour() time.Time {
	if q.Since.IsZero() {
		return time.Time{}
	}
	return HourOf(q.Since)
}

// Matches reports whether the row u is selected by q.
func (q UsageQuery) Matches(u Usage) bool {
	h := HourOf(u.Hour)
	return (q.Since.IsZero() || !h.Before(q.SinceHour())) &&
		(q.Until.IsZero() || h.Before(q.Until)) &&
		(q.KeyID == "" || u.KeyID == q.KeyID) &&
		(q.Model == "" || u.Model == q.Model)
}

// Validate checks a row before it is added.
func (u Usage) Validate() error {
	var errs []error
	switch {
	case u.KeyID == "":
		errs = append(errs, fieldErr("key_id", "must not be empty"))
	case len(u.KeyID) > MaxUsageKeyID || !utf8.ValidString(u.KeyID) ||
		containsFunc(u.KeyID, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		errs = append(errs, fieldErr("key_id", "must be at most %d bytes of UTF-8 without spaces or control characters", MaxUsageKeyID))
	}
	if e := validateModel("model", u.Model); e != nil {
		errs = append(errs, e)
	}
	if u.Hour.IsZero() {
		errs = append(errs, fieldErr("hour", "must be set"))
	} else if y := u.Hour.UTC().Year(); y < 1970 || y > 9999 {
		errs = append(errs, fieldErr("hour", "must be between 1970 and 9999, got year %d", y))
	}
	for _, c := range []struct {
		field string
		v     int64
	}{{"requests", u.Requests}, {"prompt_tokens", u.PromptTokens}, {"cached_tokens", u.CachedTokens}, {"output_tokens", u.OutputTokens}, {"errors", u.Errors}} {
		if c.v < 0 {
			errs = append(errs, fieldErr(c.field, "must not be negative, got %d", c.v))
		}
	}
	for _, c := range []struct {
		field string
		v     float64
	}{{"queue_seconds", u.QueueSeconds}, {"ttft_seconds", u.TTFTSeconds}, {"duration_seconds", u.DurationSeconds}} {
		if math.IsNaN(c.v) || math.IsInf(c.v, 0) || c.v < 0 {
			errs = append(errs, fieldErr(c.field, "must be a finite number of seconds, not negative, got %v", c.v))
		}
	}
	return errors.Join(errs...)
}

func containsFunc(s string, f func(rune) bool) bool {
	for _, r := range s {
		if f(r) {
			return true
		}
	}
	return false
}

// Add sums o's counters into u (identity fields unchanged).
func (u *Usage) Add(o Usage) {
	u.Requests += o.Requests
	u.PromptTokens += o.PromptTokens
	u.CachedTokens += o.CachedTokens
	u.OutputTokens += o.OutputTokens
	u.Errors += o.Errors
	u.QueueSeconds += o.QueueSeconds
	u.TTFTSeconds += o.TTFTSeconds
	u.DurationSeconds += o.DurationSeconds
}

// CompareUsage orders rows by hour, key id, model (bytewise): the order
// Store.Usage returns.
func CompareUsage(a, b Usage) int {
	if c := a.Hour.Compare(b.Hour); c != 0 {
		return c
	}
	if c := cmp.Compare(a.KeyID, b.KeyID); c != 0 {
		return c
	}
	return cmp.Compare(a.Model, b.Model)
}

// MergeUsage returns one row per key, model and hour (hours truncated to
// the UTC hour) with the counters of rows summed, ordered by CompareUsage.
// The stores merge a batch with it before writing, so each row is written
// once and in one order (no deadlocks between gateways writing at once).
func MergeUsage(rows []Usage) []Usage {
	type id struct {
		key, model string
		hour       int64
	}
	idx := make(map[id]int, len(rows))
	out := make([]Usage, 0, len(rows))
	for _, u := range rows {
		u.Hour = HourOf(u.Hour)
		k := id{u.KeyID, u.Model, u.Hour.Unix()}
		if i, ok := idx[k]; ok {
			out[i].Add(u)
			continue
		}
		idx[k] = len(out)
		out = append(out, u)
	}
	slices.SortFunc(out, CompareUsage)
	return out
}
