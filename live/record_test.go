package live

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/internal/testfleet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

const testSalt = "0123456789abcdef-test-salt"

func recordConfig(dir string) config.Record {
	c := config.Default().Record
	c.Path = filepath.Join(dir, "traffic.parquet")
	c.Salt = testSalt
	return c
}

// testRecorder starts a recorder on c whose fleet is model m's replicas a
// and b; fleetGate, when set, holds the writer when it starts a file until
// it is closed (a slow sink).
func testRecorder(t *testing.T, c config.Record, fleetGate chan struct{}) (*trafficRecorder, *metrics) {
	t.Helper()
	met := newMetrics(&Server{version: "test"})
	fl := func() (map[string][]string, map[string]string, map[string]int) {
		if fleetGate != nil {
			<-fleetGate
		}
		return map[string][]string{"m": {"a", "b"}}, map[string]string{"m": "cost_model"}, map[string]int{"m": 16}
	}
	r, err := newRecorder(c, "test", fl, met, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return r, met
}

var recTestModel = &model{name: "m", policy: "cost_model", blockSize: 16}

// testPrompt is n tokens, the first shared of them common to every prompt
// with the same shared and the rest from seed.
func testPrompt(n, shared int, seed uint32) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		if i < shared {
			ids[i] = uint32(i + 1)
		} else {
			ids[i] = 100000 + seed*7919 + uint32(i)
		}
	}
	return ids
}

// recordOne is one request through the recorder's request path: it began at
// began and ends now.
func recordOne(r *trafficRecorder, id int, began time.Time, prompt []uint32, outcome string) {
	recordEnd(r, recordBegin(r, id, began), id, began, prompt, outcome)
}

// recordBegin is a request's arrival at the recorder.
func recordBegin(r *trafficRecorder, id int, began time.Time) recToken {
	return r.begin("boot-"+strconv.FormatUint(uint64(id), 36), began)
}

// recordEnd is a request's end (recordBegin gave tok).
func recordEnd(r *trafficRecorder, tok recToken, id int, began time.Time, prompt []uint32, outcome string) {
	reqID := "boot-" + strconv.FormatUint(uint64(id), 36)
	user := "user-" + strconv.Itoa(id%3)
	salt := kvblock.Salt("m", "", "")
	in := &inbound{m: recTestModel, ids: prompt, salt: salt, f: fields{User: &user},
		req: gateway.Request{PromptTokens: len(prompt), Tenant: "tenant-" + strconv.Itoa(id%2), Priority: id % 3, MaxTokens: 40,
			BlockHashes: kvblock.AppendHashes(nil, salt, prompt, 16)}}
	ar := &accessRecord{began: began, outcome: outcome, replica: "a", queued: time.Millisecond,
		ttft: time.Since(began) / 2, outputTokens: 20, cachedTokens: 16, cachedKnown: true, predicted: 16}
	r.end(tok, reqID, in, ar)
}

// recFiles lists the recording's files (final and partial) in dir, in name
// order.
func recFiles(t *testing.T, dir string) (final, partial []string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		switch {
		case strings.HasSuffix(e.Name(), ".parquet"):
			final = append(final, filepath.Join(dir, e.Name()))
		case strings.HasSuffix(e.Name(), ".parquet.partial"):
			partial = append(partial, filepath.Join(dir, e.Name()))
		}
	}
	return final, partial
}

// readRecording reads one file whole (an error if it is truncated).
func readRecording(t *testing.T, path string) ([]traces.Record, traces.RecordingMeta) {
	t.Helper()
	r, err := traces.NewParquet(path, traces.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.(*traces.ParquetReader).Close()
	var out []traces.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, rec)
	}
	meta, err := traces.ReadRecordingMeta(path)
	if err != nil {
		t.Fatal(err)
	}
	return out, meta
}

// Files rotate by age: each is complete and readable once renamed, the one
// being written is .partial, and shutdown completes the last one.
func TestRecordRotatesByInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c := recordConfig(dir)
		c.RotateInterval, c.FlushInterval = time.Minute, 10*time.Second
		r, met := testRecorder(t, c, nil)
		start := time.Now()
		const n = 210 // one a second for 3.5 minutes
		for i := range n {
			began := time.Now()
			time.Sleep(500 * time.Millisecond)
			recordOne(r, i+1, began, testPrompt(40, 16, uint32(i)), "ok")
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		final, partial := recFiles(t, dir)
		if len(final) != 3 || len(partial) != 1 {
			t.Fatalf("after %v: %d files and %d partial, want 3 and 1", time.Since(start), len(final), len(partial))
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		final, partial = recFiles(t, dir)
		if len(final) != 4 || len(partial) != 0 {
			t.Fatalf("after close: %d files and %d partial, want 4 and 0", len(final), len(partial))
		}
		total := 0
		var lastStart time.Time
		for k, path := range final {
			recs, meta := readRecording(t, path)
			if meta.Sequence != k+1 || meta.Dropped != 0 || meta.Reordered != 0 || meta.SaltFingerprint != r.keys.fingerprint {
				t.Fatalf("%s: metadata %+v", path, meta)
			}
			if !meta.Start.After(lastStart) || len(recs) == 0 || recs[0].Arrival != 0 {
				t.Fatalf("%s: starts %v after %v, first arrival %v", path, meta.Start, lastStart, recs[0].Arrival)
			}
			lastStart = meta.Start
			if k < 3 && (len(recs) < 55 || len(recs) > 61) {
				t.Fatalf("%s: %d rows, want about 60 (one minute)", path, len(recs))
			}
			for i := 1; i < len(recs); i++ {
				if d := recs[i].Arrival - recs[i-1].Arrival; d != time.Second {
					t.Fatalf("%s: row %d arrived %v after the previous one, want 1s", path, i, d)
				}
			}
			total += len(recs)
		}
		if total != n || testutil.ToFloat64(met.recordWritten) != n || testutil.ToFloat64(met.recordFiles) != 4 {
			t.Fatalf("%d rows in the files, %v counted written, %v files; want %d, %d, 4", total, testutil.ToFloat64(met.recordWritten), testutil.ToFloat64(met.recordFiles), n, n)
		}
	})
}

// Files rotate by size: each holds about rotate_bytes.
func TestRecordRotatesBySize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c := recordConfig(dir)
		c.RotateBytes = 64 * config.KiB
		r, _ := testRecorder(t, c, nil)
		const n = 600 // rows of about 1.6 KB (100 hash ids each)
		for i := range n {
			began := time.Now()
			time.Sleep(10 * time.Millisecond)
			recordOne(r, i+1, began, testPrompt(1600, 0, uint32(i)), "ok")
		}
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		final, _ := recFiles(t, dir)
		if len(final) < 6 {
			t.Fatalf("%d files of 64KiB for about 550 KB of rows, want about 9", len(final))
		}
		total := 0
		for _, path := range final[:len(final)-1] {
			st, _ := os.Stat(path)
			if st.Size() < 48<<10 || st.Size() > 80<<10 {
				t.Errorf("%s: %d bytes, want about 64KiB", path, st.Size())
			}
		}
		for _, path := range final {
			recs, _ := readRecording(t, path)
			total += len(recs)
		}
		if total != n {
			t.Fatalf("%d rows, want %d", total, n)
		}
	})
}

// When the writer is behind, rows are dropped and counted, and the request
// path never waits.
func TestRecordDropsWhenSinkIsSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c := recordConfig(dir)
		c.Buffer = 50
		gate := make(chan struct{})
		r, met := testRecorder(t, c, gate)
		const n = 500
		began := time.Now()
		recordOne(r, 1, began, testPrompt(32, 16, 0), "ok")
		time.Sleep(r.tickEvery()) // the writer takes it at its next tick
		synctest.Wait()           // and holds it, stuck starting its file
		sent := time.Now()
		for i := 1; i < n; i++ {
			recordOne(r, i+1, began, testPrompt(32, 16, uint32(i)), "ok")
		}
		if d := time.Since(sent); d != 0 {
			t.Fatalf("the request path waited %v", d)
		}
		dropped := testutil.ToFloat64(met.recordDropped.WithLabelValues("buffer_full"))
		if want := float64(n - c.Buffer - 1); dropped != want {
			t.Fatalf("dropped %v, want %v", dropped, want)
		}
		close(gate)
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		final, _ := recFiles(t, dir)
		recs, meta := readRecording(t, final[0])
		if len(final) != 1 || len(recs) != c.Buffer+1 || testutil.ToFloat64(met.recordWritten) != float64(c.Buffer+1) {
			t.Fatalf("%d files, %d rows, %v counted written; want 1, %d", len(final), len(recs), testutil.ToFloat64(met.recordWritten), c.Buffer+1)
		}
		if meta.Dropped != int64(dropped) {
			t.Fatalf("the file says %d dropped, want %v", meta.Dropped, dropped)
		}
		// After close, a request is not recorded (nor counted).
		recordOne(r, n+1, time.Now(), testPrompt(32, 16, 1), "ok")
		if testutil.ToFloat64(met.recordDropped.WithLabelValues("shutdown")) != 0 {
			t.Fatal("a request that began after close was counted")
		}
	})
}

// The writer takes rows in batches, not one by one as they are sent (a send
// that readied it cost the request path a wake-up): at each tick, when
// recBatch wait, and at once when the buffer is half full, so the buffer
// still bounds what waits.
func TestRecordWriterDrainsInBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			buffer, sends, kickAt int // kickAt: the send that wakes it
		}{{1000, 3 * recBatch, recBatch}, {10, 9, 5}} {
			cfg := recordConfig(t.TempDir())
			cfg.Buffer = c.buffer
			r, _ := testRecorder(t, cfg, nil)
			for i := 1; i <= c.sends; i++ {
				recordOne(r, i, time.Now(), testPrompt(32, 16, uint32(i)), "ok")
				synctest.Wait()
				want := i
				if i >= c.kickAt {
					want = (i - c.kickAt) % c.kickAt
				}
				if n := len(r.ch); n != want {
					t.Fatalf("buffer %d: %d rows waiting after %d sends, want %d", c.buffer, n, i, want)
				}
			}
			if len(r.ch) > 0 {
				time.Sleep(r.tickEvery())
				synctest.Wait()
				if n := len(r.ch); n != 0 {
					t.Fatalf("buffer %d: %d rows waiting after a tick, want 0", c.buffer, n)
				}
			}
			r.close()
		}
	})
}

// Shutdown writes what is held and completes the file; rows are in arrival
// order whatever order their requests ended in.
func TestRecordShutdownFlushesInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c := recordConfig(dir)
		c.FlushInterval, c.RotateInterval = time.Hour, time.Hour
		r, met := testRecorder(t, c, nil)
		t0 := time.Now()
		// Request 1 arrives first and ends last; 2..20 end in between.
		long := r.begin("boot-1", t0)
		var wg sync.WaitGroup
		for i := 2; i <= 20; i++ {
			time.Sleep(time.Second)
			began := time.Now()
			tok := recordBegin(r, i, began)
			wg.Go(func() {
				time.Sleep(time.Duration(30-2*i) * time.Second) // later arrivals end sooner
				recordEnd(r, tok, i, began, testPrompt(20, 0, uint32(i)), "ok")
			})
		}
		wg.Wait()
		synctest.Wait()
		if _, partial := recFiles(t, dir); len(partial) != 0 {
			t.Fatalf("%d files started while the first request was in flight: rows would be out of order", len(partial))
		}
		ar := &accessRecord{began: t0, outcome: "stream_broken", replica: "b"}
		r.end(long, "boot-1", &inbound{m: recTestModel, req: gateway.Request{PromptTokens: 9, MaxTokens: 33}}, ar)
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		final, partial := recFiles(t, dir)
		if len(final) != 1 || len(partial) != 0 {
			t.Fatalf("%d files, %d partial", len(final), len(partial))
		}
		recs, meta := readRecording(t, final[0])
		if len(recs) != 20 || testutil.ToFloat64(met.recordWritten) != 20 || meta.Reordered != 0 {
			t.Fatalf("%d rows (%v counted), %d reordered; want 20, 0", len(recs), testutil.ToFloat64(met.recordWritten), meta.Reordered)
		}
		for i, rec := range recs {
			if rec.ID != uint64(i+1) || rec.Arrival != time.Duration(i)*time.Second {
				t.Fatalf("row %d: id %d at %v, want id %d at %ds", i, rec.ID, rec.Arrival, i+1, i)
			}
		}
		first := recs[0]
		if m := first.Measured; m.Outcome != "stream_broken" || m.Replica != "b" || m.CachedTokens != -1 || first.OutputTokens != 33 || first.InputTokens != 9 || first.HashIDs != nil || first.BlockSize != 0 {
			t.Fatalf("the failed request's row: %+v %+v", first, *m)
		}
		ok := recs[1]
		if m := ok.Measured; m.Outcome != "ok" || m.E2E != 26*time.Second || m.TTFT != m.E2E/2 || m.TPOT != ((m.E2E-m.TTFT)/19).Truncate(time.Microsecond) ||
			m.CachedTokens != 16 || m.PredictedCachedTokens != 16 || m.Policy != "cost_model" || m.Queue != time.Millisecond || m.Tenant == 0 ||
			ok.OutputTokens != 20 || ok.InputTokens != 20 || ok.BlockSize != 16 || len(ok.HashIDs) != 2 || ok.Session == 0 || ok.Priority != 2 || ok.Model != "m" {
			t.Fatalf("an ok row: %+v %+v", ok, *m)
		}
		if !meta.Start.Equal(t0) || !slices.Equal(meta.Fleet["m"], []string{"a", "b"}) || meta.Policy["m"] != "cost_model" || meta.BlockSize["m"] != 16 || meta.Sample != 1 {
			t.Fatalf("metadata %+v", meta)
		}
	})
}

// A request that outlives the reorder buffer (buffer rows) no longer holds
// the others: its row is written late, at the latest arrival, and counted.
func TestRecordReorderBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		c := recordConfig(dir)
		c.Buffer = 10
		r, _ := testRecorder(t, c, nil)
		t0 := time.Now()
		long := r.begin("boot-1", t0)
		for i := 2; i <= 30; i++ {
			time.Sleep(time.Second)
			recordOne(r, i, time.Now(), testPrompt(20, 0, uint32(i)), "ok")
			synctest.Wait()
		}
		r.end(long, "boot-1", &inbound{m: recTestModel, req: gateway.Request{PromptTokens: 9}}, &accessRecord{began: t0, outcome: "ok"})
		if err := r.close(); err != nil {
			t.Fatal(err)
		}
		final, _ := recFiles(t, dir)
		recs, meta := readRecording(t, final[0])
		// Requests 2..20 were written while 1 was in flight (10 held),
		// then 1, late, at 20's arrival, then 21..30.
		if len(recs) != 30 || meta.Reordered != 1 || recs[19].ID != 1 || recs[19].Arrival != recs[18].Arrival || recs[18].ID != 20 {
			t.Fatalf("%d rows, %d reordered, rows 18 and 19: %+v, %+v", len(recs), meta.Reordered, recs[18], recs[19])
		}
		for i := 1; i < len(recs); i++ {
			if recs[i].Arrival < recs[i-1].Arrival {
				t.Fatalf("row %d arrived before row %d", i, i-1)
			}
		}
	})
}

// Sampling is a pure function of the request id, near the share.
func TestRecordSampling(t *testing.T) {
	c := recordConfig(t.TempDir())
	c.Sample = 0.25
	r, _ := testRecorder(t, c, nil)
	defer r.close()
	n := 0
	for i := range 20000 {
		id := "boot-" + strconv.Itoa(i)
		if first, again := r.sampled(id), r.sampled(id); first != again {
			t.Fatal("not deterministic")
		}
		if r.sampled(id) {
			n++
		}
	}
	if n < 4700 || n > 5300 {
		t.Fatalf("sampled %d of 20000 at 0.25", n)
	}
	if tok := r.begin("boot-x", time.Now()); tok.on != r.sampled("boot-x") {
		t.Fatal("begin disagrees with sampled")
	}
}

// hash_ids: one per block (the last partial), equal for equal prefixes
// under one salt, unrelated under another; identities likewise.
func TestRecordHashIDs(t *testing.T) {
	k1, err := newRecordKeys(testSalt)
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := newRecordKeys(testSalt + "2")
	salt := kvblock.Salt("m", "", "")
	row := func(ids []uint32) *recRow {
		return &recRow{blockSize: 16, salt: salt, ids: ids, hashes: kvblock.AppendHashes(nil, salt, ids, 16)}
	}
	a, b := testPrompt(40, 32, 1), testPrompt(40, 32, 2)
	ha, hb := k1.hashIDs(row(a)), k1.hashIDs(row(b))
	if len(ha) != 3 || !slices.Equal(ha[:2], hb[:2]) || ha[2] == hb[2] {
		t.Fatalf("shared two blocks: %x and %x", ha, hb)
	}
	if !slices.Equal(k1.hashIDs(row(a)), ha) {
		t.Fatal("not deterministic")
	}
	if got := k1.hashIDs(&recRow{blockSize: 16, salt: salt, ids: a}); !slices.Equal(got, ha) {
		t.Fatal("without the router's hashes: different ids")
	}
	for _, x := range k2.hashIDs(row(a)) {
		if slices.Contains(ha, x) {
			t.Fatal("two salts share an id")
		}
	}
	if id := k1.identity('t', "x"); id == k1.identity('u', "x") || id == k2.identity('t', "x") || id != k1.identity('t', "x") {
		t.Fatal("identities are not keyed by domain and salt")
	}
	if k1.fingerprint == k2.fingerprint || len(k1.fingerprint) != 16 || strings.Contains(testSalt, k1.fingerprint) {
		t.Fatalf("fingerprints %q and %q", k1.fingerprint, k2.fingerprint)
	}
}

func TestRecordConfigErrors(t *testing.T) {
	c := recordConfig(t.TempDir())
	c.Salt, c.SaltFile = "", filepath.Join(t.TempDir(), "missing")
	if _, err := newRecorder(c, "", nil, newMetrics(&Server{}), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "record.salt_file") {
		t.Fatalf("missing salt file: %v", err)
	}
	bad := config.Default()
	bad.Record.Path = filepath.Join(t.TempDir(), "r.parquet")
	m := config.DefaultModel()
	m.Name, m.Replicas = "m", []config.Replica{{Name: "a", URL: "http://127.0.0.1:1"}}
	bad.Models = []config.Model{m}
	if _, err := New(&bad, Deps{}); err == nil || !strings.Contains(err.Error(), "record.salt") {
		t.Fatalf("recording without a salt: %v", err)
	}
}

// Through the live test harness on virtual time: bench -> live (recording)
// -> 3 engines. The recording has a row per request, ok, in arrival order,
// with TTFTs as bench measured them, the fleet and the policy; sim can
// replay it.
func TestRecordThroughLive(t *testing.T) {
	wl, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = 300, fleet.DefaultRate("w1", 3), 5
	dir := t.TempDir()
	var out *bench.Output
	synctest.Test(t, func(t *testing.T) {
		out = recordRun(t, wl, func(c *config.Config) {
			c.Record = recordConfig(dir)
		})
	})
	final, partial := recFiles(t, dir)
	if len(final) != 1 || len(partial) != 0 {
		t.Fatalf("%d files, %d partial", len(final), len(partial))
	}
	recs, meta := readRecording(t, final[0])
	if out.Summary.Failed != 0 || len(recs) != len(out.Records) {
		t.Fatalf("%d rows for %d requests (%d failed)", len(recs), len(out.Records), out.Summary.Failed)
	}
	var ttftRec, ttftBench []float64
	hits, prompt := 0, 0
	for i, r := range recs {
		m := r.Measured
		if m == nil || m.Outcome != "ok" || m.Policy != "cost_model" || !strings.HasPrefix(m.Replica, "replica-") || r.Model != server.DefaultModelName {
			t.Fatalf("row %d: %+v %+v", i, r, m)
		}
		if r.BlockSize != 16 || len(r.HashIDs) != (r.InputTokens+15)/16 || m.CachedTokens < 0 {
			t.Fatalf("row %d: %d tokens, %d hash ids of %d, cached %d", i, r.InputTokens, len(r.HashIDs), r.BlockSize, m.CachedTokens)
		}
		if i > 0 && r.Arrival < recs[i-1].Arrival {
			t.Fatalf("row %d arrived before row %d", i, i-1)
		}
		ttftRec = append(ttftRec, m.TTFT.Seconds())
		hits += m.CachedTokens
		prompt += r.InputTokens
	}
	for _, br := range out.Records {
		ttftBench = append(ttftBench, br.TTFT().Seconds())
	}
	sort.Float64s(ttftRec)
	sort.Float64s(ttftBench)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		a, b := ttftRec[int(q*float64(len(ttftRec)-1))], ttftBench[int(q*float64(len(ttftBench)-1))]
		if math.Abs(a-b) > 0.05*b+0.001 {
			t.Errorf("TTFT p%.0f: recorded %.4fs, bench %.4fs", 100*q, a, b)
		}
	}
	if hr := float64(hits) / float64(prompt); out.CachedReported > 0 && math.Abs(hr-out.Summary.HitRate) > 0.02 {
		t.Errorf("hit rate: recorded %.3f, bench %.3f", hr, out.Summary.HitRate)
	}
	if len(meta.Fleet[server.DefaultModelName]) != 3 || meta.Policy[server.DefaultModelName] != "cost_model" {
		t.Fatalf("metadata %+v", meta)
	}
	// The simulator replays it as it would any trace: every request, in
	// order.
	r, err := traces.NewParquet(final[0], traces.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := traces.NewSource(r, traces.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ok := src.Next(); ok; _, ok = src.Next() {
		n++
	}
	if n != len(recs) || src.Err() != nil || src.Reordered() != 0 {
		t.Fatalf("replayed %d of %d, %v, %d reordered", n, len(recs), src.Err(), src.Reordered())
	}
	t.Logf("%d rows; TTFT p50 recorded %.1f ms, bench %.1f ms", len(recs), 1e3*ttftRec[len(ttftRec)/2], 1e3*ttftBench[len(ttftBench)/2])
}

// recordRun runs wl through bench -> live -> 3 mock engines on an in-memory
// network (call it inside a synctest bubble); edit changes live's
// configuration.
func recordRun(t *testing.T, wl workload.Config, edit func(*config.Config)) *bench.Output {
	ec := engine.DefaultConfig()
	return testfleet.Run(t, testfleet.Config{Engine: ec, Replicas: 3, Workload: wl,
		Gateway: func(reps []config.Replica, tr http.RoundTripper) (testfleet.Gateway, error) {
			o := config.Default()
			mo := config.DefaultModel()
			mo.Name, mo.Policy, mo.MaxConcurrency, mo.MaxPending, mo.MaxModelLen = server.DefaultModelName, "cost_model", 1024, 1024, ec.MaxModelLen
			mo.Replicas = reps
			o.Models = []config.Model{mo}
			edit(&o)
			return New(&o, Deps{Transport: tr, Encoders: map[string]Encoder{mo.Name: simModel(t)}})
		}})
}

// The privacy test: no 8 bytes of any prompt, nor a distinctive word, a
// tenant, a user or the salt, appear in a recording's bytes; equal prompts
// give equal hash_ids under one salt, and two salts give disjoint ids.
func TestRecordPrivacy(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	secretWords := []string{"zebracorn", "quixotically", "marmalade-protocol", "xylophonist"}
	base := words(500, 64) // shared by every prompt: a common system prompt
	var prompts []string
	for i, w := range secretWords {
		prompts = append(prompts, base+" "+w+" "+words(2000+97*i, 40))
	}
	salts := []string{"first-deployment-salt-0001", "second-deployment-salt-002"}
	ids := make([][][]uint64, len(salts)) // by salt, by request
	var all [][]byte
	for si, salt := range salts {
		dir := t.TempDir()
		c := testConfig(t, up)
		c.Record = recordConfig(dir)
		c.Record.Salt = salt
		g := startGateway(t, c)
		for round := range 2 { // every prompt twice
			for i, p := range prompts {
				hdr := map[string]string{HeaderTenant: "tenant-" + secretWords[i]}
				body := map[string]any{"prompt": p, "max_tokens": 4, "stream": round == 0, "user": "user-" + secretWords[i]}
				path := "/v1/completions"
				if i%2 == 1 {
					path = "/v1/chat/completions"
					body = map[string]any{"messages": []map[string]string{{"role": "user", "content": p}}, "max_tokens": 4, "user": "user-" + secretWords[i]}
				}
				resp, err := g.post(context.Background(), path, body, hdr)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
		}
		// A request refused (unknown model) is recorded too, naming nothing.
		resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"model": "model-" + secretWords[0], "prompt": prompts[0]}, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		g.stop()
		final, partial := recFiles(t, dir)
		if len(final) != 1 || len(partial) != 0 {
			t.Fatalf("%d files, %d partial", len(final), len(partial))
		}
		data, err := os.ReadFile(final[0])
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, data)
		recs, _ := readRecording(t, final[0])
		if len(recs) != 2*len(prompts)+1 || recs[len(recs)-1].Measured.Outcome != "unknown_model" || recs[len(recs)-1].Model != "" {
			t.Fatalf("salt %d: %d rows, last %+v", si, len(recs), recs[len(recs)-1])
		}
		for _, r := range recs[:len(recs)-1] {
			ids[si] = append(ids[si], r.HashIDs)
		}
	}
	for _, data := range all {
		for _, p := range prompts {
			for i := 0; i+8 <= len(p); i++ {
				if bytes.Contains(data, []byte(p[i:i+8])) {
					t.Fatalf("the recording holds %q, 8 bytes of a prompt", p[i:i+8])
				}
			}
		}
		for _, w := range append(append([]string{}, secretWords...), salts...) {
			if bytes.Contains(data, []byte(w)) {
				t.Fatalf("the recording holds %q", w)
			}
		}
	}
	n := len(prompts)
	for si := range salts {
		for i := range n {
			a, b := ids[si][i], ids[si][n+i] // the same prompt, twice
			if len(a) == 0 || !slices.Equal(a, b) {
				t.Fatalf("salt %d: prompt %d gave %x then %x", si, i, a, b)
			}
			if ids[si][i%2][0] != a[0] { // the same endpoint, the same first block
				t.Fatalf("salt %d: prompts sharing their first block have different first ids", si)
			}
		}
	}
	for _, a := range ids[0] {
		for _, b := range ids[1] {
			for _, x := range a {
				if slices.Contains(b, x) {
					t.Fatalf("two salts share hash id %x", x)
				}
			}
		}
	}
}

// BenchmarkRecordRequestPath is what recording costs a request on its
// path: the arrival's registration and the row handed over. The writer is
// replaced by one that only takes the rows back (BenchmarkRecordWriter
// measures the real one), so the path is measured, not a full buffer.
func BenchmarkRecordRequestPath(b *testing.B) {
	c := recordConfig(b.TempDir())
	met := newMetrics(&Server{version: "bench"})
	fl := func() (map[string][]string, map[string]string, map[string]int) { return nil, nil, nil }
	r, err := buildRecorder(c, "bench", fl, met, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	sunk := make(chan struct{})
	go func() {
		defer close(sunk)
		for {
			select {
			case row := <-r.ch:
				r.mu.Lock()
				r.arrived(row.tok.idx)
				r.mu.Unlock()
				*row = recRow{}
				r.pool.Put(row)
			case <-r.stop:
				return
			}
		}
	}()
	prompt := testPrompt(2000, 1000, 1)
	salt := kvblock.Salt("m", "", "")
	user := "user-1"
	in := &inbound{m: recTestModel, ids: prompt, salt: salt, f: fields{User: &user},
		req: gateway.Request{PromptTokens: len(prompt), Tenant: "t", BlockHashes: kvblock.AppendHashes(nil, salt, prompt, 16)}}
	ar := &accessRecord{began: time.Now(), outcome: "ok", replica: "a", outputTokens: 100, cachedKnown: true}
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "boot-" + strconv.FormatUint(uint64(i), 36)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := ids[i%len(ids)]
		tok := r.begin(id, ar.began)
		r.end(tok, id, in, ar)
	}
	b.StopTimer()
	close(r.stop)
	<-sunk
	b.ReportMetric(testutil.ToFloat64(met.recordDropped.WithLabelValues("buffer_full"))/float64(b.N), "dropped/op")
}

// BenchmarkRecordWriter is the writer's cost per row (off the request
// path): keying 125 block hashes, ordering, encoding, writing.
func BenchmarkRecordWriter(b *testing.B) {
	c := recordConfig(b.TempDir())
	met := newMetrics(&Server{version: "bench"})
	fl := func() (map[string][]string, map[string]string, map[string]int) { return nil, nil, nil }
	r, err := buildRecorder(c, "bench", fl, met, slog.New(slog.DiscardHandler)) // no writer goroutine: this is it
	if err != nil {
		b.Fatal(err)
	}
	prompt := testPrompt(2000, 1000, 1)
	salt := kvblock.Salt("m", "", "")
	hashes := kvblock.AppendHashes(nil, salt, prompt, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := "boot-" + strconv.FormatUint(uint64(i), 36)
		tok := r.begin(id, time.Now())
		row := &recRow{tok: tok, reqID: id, model: "m", policy: "p", blockSize: 16, salt: salt, hashes: hashes, ids: prompt,
			tenant: "t", user: "u", hasUser: true, input: len(prompt), output: 100, outcome: "ok", e2e: time.Second}
		r.accept(row)
		r.writeReady(false)
	}
	b.StopTimer()
	r.closeFile()
}
