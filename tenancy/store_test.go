package tenancy

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestHourOf(t *testing.T) {
	in := time.Date(2026, 5, 1, 23, 59, 59, 999, time.FixedZone("X", -(3*3600+1800)))
	got := HourOf(in)
	want := time.Date(2026, 5, 2, 3, 0, 0, 0, time.UTC)
	if !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("HourOf(%v) = %v, want %v", in, got, want)
	}
}

func TestUsageQueryMatches(t *testing.T) {
	h := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	u := Usage{KeyID: "k", Model: "m", Hour: h}
	for _, tc := range []struct {
		q    UsageQuery
		want bool
	}{
		{UsageQuery{}, true},
		{UsageQuery{Since: h}, true},
		{UsageQuery{Since: h.Add(59 * time.Minute)}, true}, // overlaps the hour
		{UsageQuery{Since: h.Add(time.Hour)}, false},
		{UsageQuery{Until: h}, false},
		{UsageQuery{Until: h.Add(time.Minute)}, true},
		{UsageQuery{KeyID: "k", Model: "m"}, true},
		{UsageQuery{KeyID: "K"}, false},
		{UsageQuery{Model: "x"}, false},
	} {
		if got := tc.q.Matches(u); got != tc.want {
			t.Errorf("%+v.Matches = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestUsageValidate(t *testing.T) {
	good := Usage{KeyID: "k", Model: "m", Hour: now, Requests: 1}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mutate func(*Usage)
		want   string
	}{
		{func(u *Usage) { u.KeyID = "" }, "key_id: must not be empty"},
		{func(u *Usage) { u.KeyID = "a b" }, "key_id: must be at most 64 bytes"},
		{func(u *Usage) { u.KeyID = strings.Repeat("k", 65) }, "key_id: must be at most 64 bytes"},
		{func(u *Usage) { u.Model = "" }, "model: must not be empty"},
		{func(u *Usage) { u.Hour = time.Time{} }, "hour: must be set"},
		{func(u *Usage) { u.Hour = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "hour: must be between 1970 and 9999"},
		{func(u *Usage) { u.PromptTokens = -1 }, "prompt_tokens: must not be negative, got -1"},
		{func(u *Usage) { u.CachedTokens = -1 }, "cached_tokens: must not be negative"},
		{func(u *Usage) { u.Errors = -1 }, "errors: must not be negative"},
		{func(u *Usage) { u.QueueSeconds = math.NaN() }, "queue_seconds: must be a finite number"},
		{func(u *Usage) { u.DurationSeconds = math.Inf(1) }, "duration_seconds: must be a finite number"},
	} {
		u := good
		tc.mutate(&u)
		err := u.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want %q", err, tc.want)
		}
	}
}

func TestMergeUsage(t *testing.T) {
	h := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	in := []Usage{
		{KeyID: "b", Model: "m", Hour: h.Add(30 * time.Minute), Requests: 1, TTFTSeconds: 0.5},
		{KeyID: "a", Model: "m", Hour: h.Add(time.Hour), Requests: 2},
		{KeyID: "b", Model: "m", Hour: h.In(time.FixedZone("X", 7200)), Requests: 3, TTFTSeconds: 0.25},
		{KeyID: "a", Model: "m", Hour: h, Requests: 4},
	}
	want := []Usage{
		{KeyID: "a", Model: "m", Hour: h, Requests: 4},
		{KeyID: "b", Model: "m", Hour: h, Requests: 4, TTFTSeconds: 0.75},
		{KeyID: "a", Model: "m", Hour: h.Add(time.Hour), Requests: 2},
	}
	if got := MergeUsage(in); !reflect.DeepEqual(got, want) {
		t.Errorf("MergeUsage:\n got %+v\nwant %+v", got, want)
	}
	if in[0].Hour != h.Add(30*time.Minute) {
		t.Error("MergeUsage changed its input")
	}
	if got := MergeUsage(nil); len(got) != 0 {
		t.Errorf("MergeUsage(nil) = %v", got)
	}
}

// Property: merging does not depend on the order of the rows, and keeps
// the totals. (Seconds are multiples of 1/4 so float sums are exact.)
func TestMergeUsageOrderIndependent(t *testing.T) {
	h := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		rows := rapid.SliceOf(rapid.Custom(func(t *rapid.T) Usage {
			return Usage{
				KeyID:        rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "key"),
				Model:        rapid.SampledFrom([]string{"m1", "m2"}).Draw(t, "model"),
				Hour:         h.Add(time.Duration(rapid.IntRange(0, 3*3600).Draw(t, "sec")) * time.Second),
				Requests:     rapid.Int64Range(0, 1000).Draw(t, "req"),
				PromptTokens: rapid.Int64Range(0, 1<<30).Draw(t, "prompt"),
				Errors:       rapid.Int64Range(0, 10).Draw(t, "err"),
				QueueSeconds: float64(rapid.IntRange(0, 1000).Draw(t, "q")) / 4,
			}
		})).Draw(t, "rows")
		a := MergeUsage(rows)
		b := MergeUsage(rapid.Permutation(rows).Draw(t, "perm"))
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("order matters:\n%+v\n%+v", a, b)
		}
		if !slices.IsSortedFunc(a, CompareUsage) {
			t.Fatal("not sorted")
		}
		var total, merged Usage
		for _, u := range rows {
			total.Add(u)
		}
		for i, u := range a {
			merged.Add(u)
			if i > 0 && CompareUsage(a[i-1], u) == 0 {
				t.Fatal("a duplicate row")
			}
			if !u.Hour.Equal(HourOf(u.Hour)) {
				t.Fatal("an hour not truncated")
			}
		}
		if total != merged {
			t.Fatalf("totals %+v, merged %+v", total, merged)
		}
	})
}
