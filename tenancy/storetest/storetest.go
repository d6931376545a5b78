package storetest

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/tenancy"
)

// Inspector is what Run needs beyond tenancy.Store to check what a store
// persisted. The stores open returns must implement it (a test wrapper
// around the real store does).
type Inspector interface {
	// Raw returns everything the store has persisted, as bytes: the
	// database files and (or) a dump of every table. Run searches it for
	// secrets (which must not be there) and hashes (which must).
	Raw(t *testing.T) []byte
	// Migrations returns the rows of schema_migrations in version order.
	Migrations(t *testing.T) []Migration
}

// Migration is a row of schema_migrations.
type Migration struct {
	Version   int
	AppliedAt time.Time
}

// Run runs the suite. open must return a store on the test's own
// database: empty the first time open is called with a given t, and the
// same database again when called again with that t (a second handle, as
// a second gateway would have, or a reopen after Close). open closes its
// stores when t ends; Close must be safe to call twice.
func Run(t *testing.T, open func(t *testing.T) tenancy.Store) {
	tests := []struct {
		name string
		f    func(t *testing.T, open func(t *testing.T) tenancy.Store)
	}{
		{"CreateGet", testCreateGet},
		{"CreateInvalid", testCreateInvalid},
		{"CreateDuplicate", testCreateDuplicate},
		{"NotFound", testNotFound},
		{"List", testList},
		{"UpdatePatch", testUpdatePatch},
		{"UpdateInvalid", testUpdateInvalid},
		{"Delete", testDelete},
		{"ExpiryTimeZones", testExpiry},
		{"ModelsRoundTrip", testModels},
		{"VerifyAfterRoundTrip", testVerify},
		{"UsageSums", testUsageSums},
		{"UsageConcurrentWriters", testUsageConcurrent},
		{"UsageFilterOrder", testUsageFilterOrder},
		{"UsageInvalid", testUsageInvalid},
		{"UsageOrderIndependent", testUsageOrderIndependent},
		{"SecretNeverStored", testSecretNeverStored},
		{"Reopen", testReopen},
		{"Cancelled", testCancelled},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open) })
	}
}

// base is a fixed instant, so the expected values do not depend on when
// the suite runs.
var base = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

func mustNewKey(t *testing.T, name string) (tenancy.Key, string) {
	t.Helper()
	k, plain, err := tenancy.NewKey(name, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	k.CreatedAt, k.UpdatedAt = time.Time{}, time.Time{}
	return k, plain
}

func mustCreate(t *testing.T, s tenancy.Store, k tenancy.Key) tenancy.Key {
	t.Helper()
	got, err := s.CreateKey(t.Context(), k)
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	return got
}

func mustGet(t *testing.T, s tenancy.Store, id string) tenancy.Key {
	t.Helper()
	got, err := s.GetKey(t.Context(), id)
	if err != nil {
		t.Fatalf("GetKey(%s): %v", id, err)
	}
	return got
}

func equalKeys(t *testing.T, what string, got, want tenancy.Key) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

func testCreateGet(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	k, _ := mustNewKey(t, "team a")
	k.Priority, k.RPM, k.TPM, k.MaxConcurrency = 7, 600, 1_000_000, 16
	k.Models = []string{"Qwen/Qwen2.5-7B-Instruct", "llama3:8b"}
	k.ExpiresAt = base.Add(30 * 24 * time.Hour)
	before := time.Now().Add(-time.Second)
	created := mustCreate(t, s, k)
	if created.CreatedAt.Before(before) || created.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("CreatedAt %v, want about now", created.CreatedAt)
	}
	if !created.UpdatedAt.Equal(created.CreatedAt) {
		t.Errorf("UpdatedAt %v, want CreatedAt %v", created.UpdatedAt, created.CreatedAt)
	}
	want := k.Normalized()
	want.CreatedAt, want.UpdatedAt = created.CreatedAt, created.UpdatedAt
	equalKeys(t, "CreateKey's result", created, want)
	equalKeys(t, "GetKey", mustGet(t, s, k.ID), want)

	// A CreatedAt given is kept (to the microsecond, in UTC).
	k2, _ := mustNewKey(t, "team b")
	k2.CreatedAt = base.In(time.FixedZone("X", -7*3600))
	got := mustCreate(t, s, k2)
	if !got.CreatedAt.Equal(base.Truncate(time.Microsecond)) || got.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt %v, want %v in UTC", got.CreatedAt, base.Truncate(time.Microsecond))
	}
	equalKeys(t, "GetKey with a given CreatedAt", mustGet(t, s, k2.ID), got)
}

func testCreateInvalid(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	for _, tc := range []struct {
		mutate func(*tenancy.Key)
		msg    string
	}{
		{func(k *tenancy.Key) { k.RPM = -5 }, "rpm: must be 0 (unlimited) or a positive integer, got -5"},
		{func(k *tenancy.Key) { k.TPM = -1 }, "tpm: must be 0 (unlimited) or a positive integer, got -1"},
		{func(k *tenancy.Key) { k.MaxConcurrency = -2 }, "max_concurrency: must be 0 (unlimited) or a positive integer, got -2"},
		{func(k *tenancy.Key) { k.Priority = 1001 }, "priority: must be between 0 and 1000, got 1001"},
		{func(k *tenancy.Key) { k.Name = "  " }, "name: must not be empty"},
		{func(k *tenancy.Key) { k.Models = []string{"a", "a"} }, `models[1]: duplicate model "a"`},
		{func(k *tenancy.Key) { k.Models = []string{"has space"} }, "models[0]: must not contain spaces"},
		{func(k *tenancy.Key) { k.ID = "short" }, "id: must be 12 characters"},
		{func(k *tenancy.Key) { k.SecretHash = nil }, "secret_hash: must be 32 bytes"},
	} {
		k, _ := mustNewKey(t, "bad")
		tc.mutate(&k)
		_, err := s.CreateKey(t.Context(), k)
		if !errors.Is(err, tenancy.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("CreateKey: error %v, want ErrInvalid with %q", err, tc.msg)
		}
		if fe := tenancy.FieldErrors(err); len(fe) != 1 {
			t.Errorf("CreateKey: %d field errors in %v, want 1", len(fe), err)
		}
	}
	if keys, err := s.ListKeys(t.Context()); err != nil || len(keys) != 0 {
		t.Errorf("ListKeys after invalid creates: %v, %v; want none", keys, err)
	}
}

func testCreateDuplicate(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	k, _ := mustNewKey(t, "first")
	mustCreate(t, s, k)
	k2, _ := mustNewKey(t, "second")
	k2.ID = k.ID
	if _, err := s.CreateKey(t.Context(), k2); !errors.Is(err, tenancy.ErrExists) {
		t.Errorf("CreateKey with an id in use: %v, want ErrExists", err)
	}
	if got := mustGet(t, s, k.ID); got.Name != "first" {
		t.Errorf("the first key was overwritten: %+v", got)
	}
}

func testNotFound(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	if _, err := s.GetKey(ctx, "000000000000"); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("GetKey unknown: %v, want ErrNotFound", err)
	}
	if _, err := s.GetKey(ctx, "not even an id ' OR 1=1 --"); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("GetKey of a strange id: %v, want ErrNotFound", err)
	}
	name := "x"
	if _, err := s.UpdateKey(ctx, "000000000000", tenancy.KeyPatch{Name: &name}); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("UpdateKey unknown: %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateKey(ctx, "000000000000", tenancy.KeyPatch{}); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("UpdateKey unknown with an empty patch: %v, want ErrNotFound", err)
	}
	if err := s.DeleteKey(ctx, "000000000000"); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("DeleteKey unknown: %v, want ErrNotFound", err)
	}
}

func testList(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	if keys, err := s.ListKeys(t.Context()); err != nil || len(keys) != 0 {
		t.Fatalf("ListKeys on an empty store: %v, %v", keys, err)
	}
	var want []tenancy.Key
	// Created out of order, two at the same instant (then ordered by id).
	for i, off := range []time.Duration{3 * time.Hour, time.Hour, 2 * time.Hour, time.Hour} {
		k, _ := mustNewKey(t, fmt.Sprintf("key %d", i))
		k.CreatedAt = base.Add(off)
		want = append(want, mustCreate(t, s, k))
	}
	slices.SortFunc(want, func(a, b tenancy.Key) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	got, err := s.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ListKeys:\n got %+v\nwant %+v", got, want)
	}
}

func ptr[T any](v T) *T { return &v }

func testUpdatePatch(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	k, _ := mustNewKey(t, "before")
	k.CreatedAt = base
	k.RPM, k.Models, k.ExpiresAt = 60, []string{"m1"}, base.Add(time.Hour)
	cur := mustCreate(t, s, k)

	steps := []struct {
		p      tenancy.KeyPatch
		expect func(*tenancy.Key)
	}{
		{tenancy.KeyPatch{Name: ptr("after")}, func(k *tenancy.Key) { k.Name = "after" }},
		{tenancy.KeyPatch{Priority: ptr(1000), RPM: ptr(int64(0)), TPM: ptr(int64(5000))},
			func(k *tenancy.Key) { k.Priority, k.RPM, k.TPM = 1000, 0, 5000 }},
		{tenancy.KeyPatch{MaxConcurrency: ptr(3), Disabled: ptr(true)}, func(k *tenancy.Key) { k.MaxConcurrency, k.Disabled = 3, true }},
		{tenancy.KeyPatch{Models: ptr([]string{"m2", "m3"})}, func(k *tenancy.Key) { k.Models = []string{"m2", "m3"} }},
		{tenancy.KeyPatch{Models: ptr([]string{})}, func(k *tenancy.Key) { k.Models = nil }},
		{tenancy.KeyPatch{ExpiresAt: ptr(base.Add(48 * time.Hour))}, func(k *tenancy.Key) { k.ExpiresAt = base.Add(48 * time.Hour).Truncate(time.Microsecond) }},
		{tenancy.KeyPatch{ExpiresAt: ptr(time.Time{})}, func(k *tenancy.Key) { k.ExpiresAt = time.Time{} }},
		{tenancy.KeyPatch{Disabled: ptr(false)}, func(k *tenancy.Key) { k.Disabled = false }},
	}
	for i, st := range steps {
		got, err := s.UpdateKey(ctx, k.ID, st.p)
		if err != nil {
			t.Fatalf("step %d: UpdateKey: %v", i, err)
		}
		want := cur
		st.expect(&want)
		want.UpdatedAt = got.UpdatedAt
		if got.UpdatedAt.Before(cur.UpdatedAt) || !got.CreatedAt.Equal(base.Truncate(time.Microsecond)) {
			t.Errorf("step %d: CreatedAt %v UpdatedAt %v after %v", i, got.CreatedAt, got.UpdatedAt, cur.UpdatedAt)
		}
		equalKeys(t, fmt.Sprintf("step %d: UpdateKey's result", i), got, want)
		equalKeys(t, fmt.Sprintf("step %d: GetKey", i), mustGet(t, s, k.ID), want)
		cur = want
	}
	// An empty patch changes nothing, UpdatedAt included.
	got, err := s.UpdateKey(ctx, k.ID, tenancy.KeyPatch{})
	if err != nil {
		t.Fatal(err)
	}
	equalKeys(t, "empty patch", got, cur)
	equalKeys(t, "GetKey after an empty patch", mustGet(t, s, k.ID), cur)
}

func testUpdateInvalid(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	k, _ := mustNewKey(t, "stays")
	k.RPM = 100
	want := mustCreate(t, s, k)
	for _, tc := range []struct {
		p   tenancy.KeyPatch
		msg string
	}{
		{tenancy.KeyPatch{RPM: ptr(int64(-5))}, "rpm: must be 0 (unlimited) or a positive integer, got -5"},
		{tenancy.KeyPatch{Name: ptr("fine"), TPM: ptr(int64(-1))}, "tpm: must be 0 (unlimited) or a positive integer"},
		{tenancy.KeyPatch{Priority: ptr(-1)}, "priority: must be between 0 and 1000, got -1"},
		{tenancy.KeyPatch{Name: ptr("")}, "name: must not be empty"},
		{tenancy.KeyPatch{Models: ptr([]string{""})}, "models[0]: must not be empty"},
	} {
		_, err := s.UpdateKey(t.Context(), k.ID, tc.p)
		if !errors.Is(err, tenancy.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("UpdateKey: %v, want ErrInvalid with %q", err, tc.msg)
		}
	}
	equalKeys(t, "GetKey after refused patches", mustGet(t, s, k.ID), want)
}

func testDelete(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	gone, _ := mustNewKey(t, "revoked")
	stays, _ := mustNewKey(t, "stays")
	mustCreate(t, s, gone)
	staysK := mustCreate(t, s, stays)
	if err := s.DeleteKey(ctx, gone.ID); err != nil {
		t.Fatalf("DeleteKey: %v", err)
	}
	if _, err := s.GetKey(ctx, gone.ID); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("GetKey after DeleteKey: %v, want ErrNotFound", err)
	}
	if err := s.DeleteKey(ctx, gone.ID); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("DeleteKey twice: %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateKey(ctx, gone.ID, tenancy.KeyPatch{Disabled: ptr(false)}); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("UpdateKey after DeleteKey: %v, want ErrNotFound", err)
	}
	if _, err := s.CreateKey(ctx, gone); !errors.Is(err, tenancy.ErrExists) {
		t.Errorf("CreateKey reusing a deleted id: %v, want ErrExists", err)
	}
	keys, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0].ID != staysK.ID {
		t.Errorf("ListKeys after DeleteKey: %+v, want only %s", keys, staysK.ID)
	}
}

func testExpiry(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	zones := []*time.Location{time.UTC, time.FixedZone("IST", 5*3600+1800), time.FixedZone("HST", -10*3600)}
	if ny, err := time.LoadLocation("America/New_York"); err == nil {
		zones = append(zones, ny)
	}
	for _, loc := range zones {
		k, _ := mustNewKey(t, "zone "+loc.String())
		at := base.Add(90 * 24 * time.Hour).Add(123 * time.Nanosecond).In(loc)
		k.ExpiresAt = at
		mustCreate(t, s, k)
		got := mustGet(t, s, k.ID)
		want := at.UTC().Truncate(time.Microsecond)
		if !got.ExpiresAt.Equal(want) || got.ExpiresAt.Location() != time.UTC {
			t.Errorf("%s: ExpiresAt %v (%v), want %v in UTC", loc, got.ExpiresAt, got.ExpiresAt.Location(), want)
		}
		if err := got.Allows("m", want.Add(-time.Microsecond)); err != nil {
			t.Errorf("%s: Allows just before expiry: %v", loc, err)
		}
		if err := got.Allows("m", want); !errors.Is(err, tenancy.ErrKeyExpired) {
			t.Errorf("%s: Allows at expiry: %v, want ErrKeyExpired", loc, err)
		}
	}
	// Never expiring stays zero.
	k, _ := mustNewKey(t, "forever")
	mustCreate(t, s, k)
	if got := mustGet(t, s, k.ID); !got.ExpiresAt.IsZero() {
		t.Errorf("ExpiresAt %v, want zero", got.ExpiresAt)
	}
}

func testModels(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	for _, models := range [][]string{
		nil,
		{},
		{"one"},
		{"Qwen/Qwen2.5-7B-Instruct", "mistralai/Mistral-Nemo-Instruct-2407", "llama3:8b", "a,b", `quo"te`, "模型", "x'y", "{braces}"},
	} {
		k, _ := mustNewKey(t, "models")
		k.Models = models
		mustCreate(t, s, k)
		got := mustGet(t, s, k.ID).Models
		want := models
		if len(want) == 0 {
			want = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Models %q came back as %q", models, got)
		}
	}
}

func testVerify(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	k, plain := mustNewKey(t, "verify")
	mustCreate(t, s, k)
	id, secret, err := tenancy.ParseAPIKey(plain)
	if err != nil || id != k.ID {
		t.Fatalf("ParseAPIKey: %q, %v", id, err)
	}
	got := mustGet(t, s, id)
	if !got.Verify(secret) {
		t.Error("the stored key does not verify its secret")
	}
	// Same public id, another secret (TensorZero's forged-key case).
	_, other := mustNewKey(t, "other")
	_, otherSecret, _ := tenancy.ParseAPIKey(other)
	if got.Verify(otherSecret) {
		t.Error("the stored key verifies another key's secret")
	}
}

func usageRow(key, model string, hour time.Time, n int64) tenancy.Usage {
	return tenancy.Usage{
		KeyID: key, Model: model, Hour: hour, Requests: n, PromptTokens: 100 * n, CachedTokens: 40 * n,
		OutputTokens: 20 * n, Errors: n / 2, QueueSeconds: 0.25 * float64(n), TTFTSeconds: 0.5 * float64(n), DurationSeconds: 2 * float64(n),
	}
}

func testUsageSums(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	if err := s.AddUsage(ctx, nil); err != nil {
		t.Fatalf("AddUsage(nil): %v", err)
	}
	h := base.Truncate(time.Hour)
	// Minutes within the hour, another zone, duplicates in one batch.
	if err := s.AddUsage(ctx, []tenancy.Usage{
		usageRow("k1", "m", base.In(time.FixedZone("X", 3*3600)), 1),
		usageRow("k1", "m", h.Add(59*time.Minute), 2),
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, []tenancy.Usage{usageRow("k1", "m", h, 4)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Usage(ctx, tenancy.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	want := []tenancy.Usage{usageRow("k1", "m", h, 7)}
	want[0].Errors = 0 + 1 + 2 // n/2 of 1, 2, 4
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Usage:\n got %+v\nwant %+v", got, want)
	}
	if got[0].Hour.Location() != time.UTC {
		t.Errorf("Hour in %v, want UTC", got[0].Hour.Location())
	}
}

func testUsageConcurrent(t *testing.T, open func(*testing.T) tenancy.Store) {
	// Two handles on one database, as two gateways would have.
	stores := []tenancy.Store{open(t), open(t)}
	const writers, calls = 8, 50
	h := base.Truncate(time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%len(stores)]
			for i := range calls {
				rows := []tenancy.Usage{
					usageRow("shared", "m1", h, 1),
					usageRow("shared", "m2", h.Add(time.Hour), 2),
					usageRow(fmt.Sprintf("own%d", g), "m1", h, int64(i%3)),
				}
				if i%2 == 1 { // and the other order
					slices.Reverse(rows)
				}
				if err := s.AddUsage(t.Context(), rows); err != nil {
					errs <- fmt.Errorf("writer %d call %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := stores[0].Usage(t.Context(), tenancy.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	// The per-writer rows: i%3 over 50 calls sums to 49, Errors to
	// sum((i%3)/2) = 16.
	own := usageRow("", "m1", h, 49)
	own.Errors = 16
	want := []tenancy.Usage{usageRow("shared", "m1", h, writers*calls)}
	want[0].Errors = 0
	for g := range writers {
		u := own
		u.KeyID = fmt.Sprintf("own%d", g)
		want = append(want, u)
	}
	m2 := usageRow("shared", "m2", h.Add(time.Hour), 2*writers*calls)
	m2.Errors = writers * calls
	want = append(want, m2)
	slices.SortFunc(want, tenancy.CompareUsage)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Usage after %d writers x %d calls:\n got %+v\nwant %+v", writers, calls, got, want)
	}
}

func testUsageFilterOrder(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	h := base.Truncate(time.Hour)
	var all []tenancy.Usage
	n := int64(1)
	// Inserted in a scrambled order.
	for _, hour := range []int{2, 0, 1} {
		for _, key := range []string{"kb", "ka", "kA"} {
			for _, model := range []string{"m/2", "m/1"} {
				all = append(all, usageRow(key, model, h.Add(time.Duration(hour)*time.Hour), n))
				n++
			}
		}
	}
	if err := s.AddUsage(ctx, all[:7]); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, all[7:]); err != nil {
		t.Fatal(err)
	}
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, tenancy.CompareUsage)
	for _, q := range []tenancy.UsageQuery{
		{},
		{KeyID: "ka"},
		{KeyID: "kA"},
		{Model: "m/1"},
		{KeyID: "kb", Model: "m/2"},
		{Since: h.Add(time.Hour)},
		{Since: h.Add(90 * time.Minute)}, // hour 1 overlaps it
		{Until: h.Add(time.Hour)},
		{Until: h.Add(61 * time.Minute)}, // hour 1 overlaps it
		{Since: h.Add(time.Hour), Until: h.Add(2 * time.Hour), KeyID: "ka"},
		{Since: h.Add(5 * time.Hour)},
		{KeyID: "nobody"},
	} {
		var want []tenancy.Usage
		for _, u := range sorted {
			if q.Matches(u) {
				want = append(want, u)
			}
		}
		got, err := s.Usage(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("Usage(%+v):\n got %+v\nwant %+v", q, got, want)
		}
	}
	// Spot-check Matches against the rule itself.
	if got, _ := s.Usage(ctx, tenancy.UsageQuery{Since: h.Add(90 * time.Minute)}); len(got) != 12 {
		t.Errorf("Since 1h30 selects %d rows, want 12 (hours 1 and 2)", len(got))
	}
}

func testUsageInvalid(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	good := usageRow("k", "m", base, 1)
	for _, tc := range []struct {
		mutate func(*tenancy.Usage)
		msg    string
	}{
		{func(u *tenancy.Usage) { u.KeyID = "" }, "key_id: must not be empty"},
		{func(u *tenancy.Usage) { u.Model = "" }, "model: must not be empty"},
		{func(u *tenancy.Usage) { u.Hour = time.Time{} }, "hour: must be set"},
		{func(u *tenancy.Usage) { u.Requests = -1 }, "requests: must not be negative"},
		{func(u *tenancy.Usage) { u.OutputTokens = -1 }, "output_tokens: must not be negative"},
		{func(u *tenancy.Usage) { u.TTFTSeconds = -0.5 }, "ttft_seconds: must be a finite number"},
	} {
		bad := good
		tc.mutate(&bad)
		err := s.AddUsage(ctx, []tenancy.Usage{good, bad})
		if !errors.Is(err, tenancy.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("AddUsage: %v, want ErrInvalid with %q", err, tc.msg)
		}
	}
	if got, err := s.Usage(ctx, tenancy.UsageQuery{}); err != nil || len(got) != 0 {
		t.Errorf("Usage after refused batches: %+v, %v; want none (a bad row writes nothing)", got, err)
	}
}

// Usage sums do not depend on how rows are batched or ordered. Seconds are
// multiples of 1/8, so float sums are exact in any order.
func testUsageOrderIndependent(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	h := base.Truncate(time.Hour)
	iter := 0
	rapid.Check(t, func(rt *rapid.T) {
		iter++
		prefix := fmt.Sprintf("p%d-", iter)
		rows := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) tenancy.Usage {
			return tenancy.Usage{
				KeyID:           prefix + rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "key"),
				Model:           rapid.SampledFrom([]string{"m1", "m2"}).Draw(rt, "model"),
				Hour:            h.Add(time.Duration(rapid.IntRange(0, 2).Draw(rt, "hour"))*time.Hour + time.Duration(rapid.IntRange(0, 3599).Draw(rt, "sec"))*time.Second),
				Requests:        rapid.Int64Range(0, 5).Draw(rt, "requests"),
				PromptTokens:    rapid.Int64Range(0, 1<<20).Draw(rt, "prompt"),
				CachedTokens:    rapid.Int64Range(0, 1<<20).Draw(rt, "cached"),
				OutputTokens:    rapid.Int64Range(0, 1<<16).Draw(rt, "output"),
				Errors:          rapid.Int64Range(0, 2).Draw(rt, "errors"),
				QueueSeconds:    float64(rapid.IntRange(0, 800).Draw(rt, "queue")) / 8,
				TTFTSeconds:     float64(rapid.IntRange(0, 800).Draw(rt, "ttft")) / 8,
				DurationSeconds: float64(rapid.IntRange(0, 8000).Draw(rt, "dur")) / 8,
			}
		}), 1, 24).Draw(rt, "rows")
		order := rapid.Permutation(rows).Draw(rt, "order")
		// Cut the shuffled rows into batches.
		for len(order) > 0 {
			n := rapid.IntRange(1, len(order)).Draw(rt, "batch")
			if err := s.AddUsage(t.Context(), order[:n]); err != nil {
				rt.Fatal(err)
			}
			order = order[n:]
		}
		// The naive sum, in input order.
		type id struct {
			key, model string
			hour       time.Time
		}
		sums := map[id]tenancy.Usage{}
		for _, u := range rows {
			k := id{u.KeyID, u.Model, u.Hour.Truncate(time.Hour)}
			acc, ok := sums[k]
			if !ok {
				acc = tenancy.Usage{KeyID: u.KeyID, Model: u.Model, Hour: k.hour}
			}
			acc.Requests += u.Requests
			acc.PromptTokens += u.PromptTokens
			acc.CachedTokens += u.CachedTokens
			acc.OutputTokens += u.OutputTokens
			acc.Errors += u.Errors
			acc.QueueSeconds += u.QueueSeconds
			acc.TTFTSeconds += u.TTFTSeconds
			acc.DurationSeconds += u.DurationSeconds
			sums[k] = acc
		}
		var want []tenancy.Usage
		for _, u := range sums {
			want = append(want, u)
		}
		slices.SortFunc(want, tenancy.CompareUsage)
		var got []tenancy.Usage
		for _, key := range []string{prefix + "a", prefix + "b"} {
			g, err := s.Usage(t.Context(), tenancy.UsageQuery{KeyID: key})
			if err != nil {
				rt.Fatal(err)
			}
			got = append(got, g...)
		}
		slices.SortFunc(got, tenancy.CompareUsage)
		if !reflect.DeepEqual(got, want) {
			rt.Fatalf("sums:\n got %+v\nwant %+v", got, want)
		}
	})
}

func inspector(t *testing.T, s tenancy.Store) Inspector {
	t.Helper()
	ins, ok := s.(Inspector)
	if !ok {
		t.Fatalf("the store %T does not implement storetest.Inspector: wrap it in the test", s)
	}
	return ins
}

func testSecretNeverStored(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	type made struct {
		k             tenancy.Key
		plain, secret string
	}
	var keys []made
	for i := range 3 {
		k, plain := mustNewKey(t, fmt.Sprintf("tenant %d", i))
		_, secret, err := tenancy.ParseAPIKey(plain)
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, k)
		keys = append(keys, made{k, plain, secret})
	}
	if _, err := s.UpdateKey(ctx, keys[0].k.ID, tenancy.KeyPatch{Name: ptr("renamed"), RPM: ptr(int64(10))}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUsage(ctx, []tenancy.Usage{usageRow(keys[1].k.ID, "m", base, 3)}); err != nil {
		t.Fatal(err)
	}
	raw := inspector(t, s).Raw(t)
	if len(raw) == 0 {
		t.Fatal("Raw returned nothing")
	}
	for _, m := range keys {
		if !bytes.Contains(raw, []byte(m.k.ID)) {
			t.Errorf("key id %s not found in the raw data: the check reads the wrong thing", m.k.ID)
		}
		if !bytes.Contains(raw, m.k.SecretHash) && !bytes.Contains(raw, []byte(hex.EncodeToString(m.k.SecretHash))) {
			t.Errorf("the hash of key %s is not in the raw data", m.k.ID)
		}
		if bytes.Contains(raw, []byte(m.plain)) {
			t.Errorf("the plaintext key %s is stored", m.k.ID)
		}
		if bytes.Contains(raw, []byte(m.secret)) {
			t.Errorf("the secret of key %s is stored", m.k.ID)
		}
		// Nor a long piece of it.
		if bytes.Contains(raw, []byte(m.secret[:20])) {
			t.Errorf("20 characters of the secret of key %s are stored", m.k.ID)
		}
	}
}

func testReopen(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx := t.Context()
	k, plain := mustNewKey(t, "persistent")
	k.Models = []string{"m"}
	created := mustCreate(t, s, k)
	if err := s.AddUsage(ctx, []tenancy.Usage{usageRow(k.ID, "m", base, 5)}); err != nil {
		t.Fatal(err)
	}
	before := inspector(t, s).Migrations(t)
	if len(before) == 0 {
		t.Fatal("no rows in schema_migrations")
	}
	for i, m := range before {
		if m.Version != i+1 || m.AppliedAt.IsZero() {
			t.Errorf("schema_migrations row %d: %+v, want version %d with a time", i, m, i+1)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for range 2 {
		s2 := open(t)
		got := mustGet(t, s2, k.ID)
		equalKeys(t, "GetKey after reopen", got, created)
		_, secret, _ := tenancy.ParseAPIKey(plain)
		if !got.Verify(secret) {
			t.Error("the key does not verify after reopen")
		}
		u, err := s2.Usage(ctx, tenancy.UsageQuery{KeyID: k.ID})
		if err != nil || len(u) != 1 || u[0].Requests != 5 {
			t.Errorf("Usage after reopen: %+v, %v", u, err)
		}
		if after := inspector(t, s2).Migrations(t); !reflect.DeepEqual(after, before) {
			t.Errorf("schema_migrations changed on reopen:\n got %+v\nwant %+v", after, before)
		}
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func testCancelled(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	k, _ := mustNewKey(t, "never")
	if _, err := s.CreateKey(ctx, k); !errors.Is(err, context.Canceled) {
		t.Errorf("CreateKey with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := s.GetKey(ctx, k.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("GetKey with a cancelled context: %v, want context.Canceled", err)
	}
	if err := s.AddUsage(ctx, []tenancy.Usage{usageRow("k", "m", base, 1)}); !errors.Is(err, context.Canceled) {
		t.Errorf("AddUsage with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := s.Usage(ctx, tenancy.UsageQuery{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Usage with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := s.GetKey(t.Context(), k.ID); !errors.Is(err, tenancy.ErrNotFound) {
		t.Errorf("the key was created under a cancelled context: %v", err)
	}
}

func testClosed(t *testing.T, open func(*testing.T) tenancy.Store) {
	s := open(t)
	k, _ := mustNewKey(t, "closed")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	checks := map[string]error{}
	_, checks["CreateKey"] = s.CreateKey(ctx, k)
	_, checks["GetKey"] = s.GetKey(ctx, k.ID)
	_, checks["ListKeys"] = s.ListKeys(ctx)
	_, checks["UpdateKey"] = s.UpdateKey(ctx, k.ID, tenancy.KeyPatch{Name: ptr("x")})
	checks["DeleteKey"] = s.DeleteKey(ctx, k.ID)
	checks["AddUsage"] = s.AddUsage(ctx, []tenancy.Usage{usageRow("k", "m", base, 1)})
	_, checks["Usage"] = s.Usage(ctx, tenancy.UsageQuery{})
	for name, err := range checks {
		if err == nil {
			t.Errorf("%s on a closed store: no error", name)
		}
	}
}
