package live

import (
	"container/heap"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/traces"
)

// The recording (the record section): one row per finished request, every
// outcome, in the project's parquet trace format (traces.ParquetWriter),
// for `inferrail sim --trace` and `inferrail fidelity --trace` to replay.
//
// On the request path a sampled request registers its arrival when it
// starts (begin) and hands a row of plain values to a bounded channel when
// it ends (end): a full channel drops the row and counts it, never waits.
// One goroutine (run) turns rows into records (keying their hashes),
// holds them until no earlier request is still in flight so that rows are
// written in arrival order, and writes them: a row group at least every
// flush_interval, a new file every rotate_interval or rotate_bytes, each
// file written as <name>.partial and renamed once complete.
//
// Privacy: no text, header value or id of a client is written. A prompt is
// its engine block hashes (chained XXH3 over its tokens, the router's own),
// each encrypted with AES-128 under a key derived from the salt and cut to
// 64 bits: equal prompts give equal hash_ids under one salt, and without
// the salt nothing can be tested against them. Tenants and the user field
// are HMAC-SHA256 under another key derived from the salt.

// recordRowGroup is the most rows in one of a recording's row groups.
const recordRowGroup = 8192

// recordCloseTimeout bounds how long Close waits for the recording's last
// file to be written.
const recordCloseTimeout = 30 * time.Second

// trafficRecorder writes the recording. The request path calls begin and
// end; the rest runs in its own goroutine.
type trafficRecorder struct {
	cfg     config.Record
	stem    string
	sample  uint64 // requests whose id hashes to at most this are recorded
	keys    recordKeys
	version string
	fleet   func() (fleet map[string][]string, policy map[string]string, block map[string]int)
	log     *slog.Logger
	written prometheus.Counter
	files   prometheus.Counter
	// dropped are inferrail_record_dropped_total's counters by reason.
	dropped  map[string]prometheus.Counter
	dropsAll atomic.Int64 // every drop, for each file's count
	// dropsMark is dropsAll when the last file was completed (the writer
	// goroutine's): a file counts the drops since.
	dropsMark int64
	pool      sync.Pool // *recRow

	// mu guards the in-flight arrivals (inflight, head, base, last) and
	// closed; rows are sent under it, so none is sent after close.
	mu       sync.Mutex
	inflight []pendingArrival
	head     int    // inflight[head:] are live
	base     uint64 // the index of inflight[head]
	last     int64  // the latest arrival handed out, Unix ns
	closed   bool
	ch       chan *recRow
	kick     chan struct{} // recBatch rows wait in ch, or it is half full: drain it now
	stop     chan struct{}
	done     chan struct{}

	// The writer goroutine's own.
	held     rowHeap
	file     *recFile
	seq      int
	failedAt time.Time // the last failure to start a file
}

// pendingArrival is a sampled request in flight.
type pendingArrival struct {
	at   int64 // Unix ns
	done bool  // its row reached the writer (or was dropped)
}

// recToken is what begin gives a request for end.
type recToken struct {
	on  bool
	idx uint64
	at  int64
}

// recRow is a finished request as the request path hands it over: plain
// values and slices that nothing changes once the request has been
// weighed.
type recRow struct {
	tok               recToken
	reqID             string
	model, policy     string
	blockSize         int
	salt              kvblock.Hash
	hashes            []kvblock.Hash
	ids               []uint32
	tenant, user      string
	hasUser           bool
	priority          int
	input, output     int
	queue, ttft, e2e  time.Duration
	replica, outcome  string
	cached, predicted int
}

// recordKeys are the keys derived from the salt.
type recordKeys struct {
	block       cipher.Block
	mac         hash.Hash // the writer goroutine's own
	fingerprint string
	scratch     []byte // the cipher's and the MAC's output (the writer goroutine's)
}

func newRecordKeys(salt string) (recordKeys, error) {
	derive := func(purpose string) []byte {
		sum := sha256.Sum256([]byte("inferrail record v1\x00" + purpose + "\x00" + salt))
		return sum[:]
	}
	block, err := aes.NewCipher(derive("hash_ids")[:16])
	if err != nil {
		return recordKeys{}, fmt.Errorf("record: %w", err)
	}
	return recordKeys{
		block:       block,
		mac:         hmac.New(sha256.New, derive("identities")),
		fingerprint: hex.EncodeToString(derive("fingerprint")[:8]),
		scratch:     make([]byte, sha256.Size),
	}, nil
}

// hashID is a block's hash_id: its engine hash encrypted under the block
// key, cut to 64 bits.
func (k *recordKeys) hashID(h kvblock.Hash) uint64 {
	b := k.scratch[:aes.BlockSize]
	binary.LittleEndian.PutUint64(b[:8], h.Hi)
	binary.LittleEndian.PutUint64(b[8:], h.Lo)
	k.block.Encrypt(b, b)
	return binary.LittleEndian.Uint64(b[:8])
}

// identity is the keyed hash of a tenant or user name (domain tells them
// apart), never 0.
func (k *recordKeys) identity(domain byte, s string) uint64 {
	k.mac.Reset()
	k.scratch[0] = domain
	k.mac.Write(k.scratch[:1])
	k.mac.Write([]byte(s))
	v := binary.LittleEndian.Uint64(k.mac.Sum(k.scratch[:0]))
	return max(v, 1)
}

// hashIDs are a prompt's hash_ids: one per block of blockSize tokens, the
// last one of a partial block hashed on from the full ones.
func (k *recordKeys) hashIDs(r *recRow) []uint64 {
	if r.blockSize <= 0 || len(r.ids) == 0 {
		return nil
	}
	full := len(r.ids) / r.blockSize
	out := make([]uint64, 0, (len(r.ids)+r.blockSize-1)/r.blockSize)
	hashes := r.hashes
	if len(hashes) != full {
		hashes = kvblock.AppendHashes(make([]kvblock.Hash, 0, full), r.salt, r.ids, r.blockSize)
	}
	for _, h := range hashes {
		out = append(out, k.hashID(h))
	}
	if rest := r.ids[full*r.blockSize:]; len(rest) > 0 {
		parent := r.salt
		if full > 0 {
			parent = hashes[full-1]
		}
		out = append(out, k.hashID(kvblock.HashBlock(parent, rest)))
	}
	return out
}

// newRecorder starts the recording c describes (nil when it is off).
func newRecorder(c config.Record, version string, fleet func() (map[string][]string, map[string]string, map[string]int), met *metrics, log *slog.Logger) (*trafficRecorder, error) {
	r, err := buildRecorder(c, version, fleet, met, log)
	if r != nil {
		go r.run()
	}
	return r, err
}

// buildRecorder is newRecorder without its writer goroutine.
func buildRecorder(c config.Record, version string, fleet func() (map[string][]string, map[string]string, map[string]int), met *metrics, log *slog.Logger) (*trafficRecorder, error) {
	if c.Path == "" {
		return nil, nil
	}
	salt, err := c.RecordSalt()
	if err != nil {
		return nil, err
	}
	keys, err := newRecordKeys(salt)
	if err != nil {
		return nil, err
	}
	r := &trafficRecorder{
		cfg: c, stem: strings.TrimSuffix(c.Path, ".parquet"), keys: keys, version: version, fleet: fleet, log: log,
		written: met.recordWritten, files: met.recordFiles, dropped: map[string]prometheus.Counter{},
		ch: make(chan *recRow, c.Buffer), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	r.pool.New = func() any { return new(recRow) }
	for _, reason := range []string{"buffer_full", "write_error", "shutdown"} {
		r.dropped[reason] = met.recordDropped.WithLabelValues(reason)
	}
	r.sample = math.MaxUint64
	if c.Sample < 1 {
		r.sample = uint64(c.Sample * (1 << 64))
	}
	return r, nil
}

// sampled reports whether the request with id reqID is recorded: a hash of
// the id (the decision log's) against the share.
func (r *trafficRecorder) sampled(reqID string) bool { return sessionOf(reqID) <= r.sample }

// begin registers a request's arrival (began) when it is recorded.
func (r *trafficRecorder) begin(reqID string, began time.Time) recToken {
	if r == nil || !r.sampled(reqID) {
		return recToken{}
	}
	at := began.UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return recToken{}
	}
	at = max(at, r.last) // arrivals in the order they were handed out
	r.last = at
	idx := r.base + uint64(len(r.inflight)-r.head)
	r.inflight = append(r.inflight, pendingArrival{at: at})
	return recToken{on: true, idx: idx, at: at}
}

// arrived marks a request's arrival as done (under mu) and drops the done
// ones at the front.
func (r *trafficRecorder) arrived(idx uint64) {
	r.inflight[r.head+int(idx-r.base)].done = true
	for r.head < len(r.inflight) && r.inflight[r.head].done {
		r.head++
		r.base++
	}
	if r.head == len(r.inflight) {
		r.inflight, r.head = r.inflight[:0], 0
	} else if r.head > 1024 && r.head > len(r.inflight)/2 {
		n := copy(r.inflight, r.inflight[r.head:])
		r.inflight, r.head = r.inflight[:n], 0
	}
}

// watermark is the arrival of the oldest request still in flight
// (math.MaxInt64 when none is): every row arrived before it has been handed
// over.
func (r *trafficRecorder) watermark() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.head == len(r.inflight) {
		return math.MaxInt64
	}
	return r.inflight[r.head].at
}

// end hands a finished request's row to the writer, or drops it (counted)
// when the writer is behind. in is nil for a request refused before its
// body was parsed.
func (r *trafficRecorder) end(tok recToken, reqID string, in *inbound, ar *accessRecord) {
	if !tok.on {
		return
	}
	row := r.pool.Get().(*recRow)
	fillRow(row, tok, reqID, in, ar)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.drop("shutdown", row)
		return
	}
	select {
	case r.ch <- row:
		r.mu.Unlock()
		if n := len(r.ch); n >= recBatch || n >= cap(r.ch)/2 {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
	default:
		r.arrived(tok.idx)
		r.mu.Unlock()
		r.drop("buffer_full", row)
	}
}

func (r *trafficRecorder) drop(reason string, row *recRow) {
	r.dropsAll.Add(1)
	r.dropped[reason].Inc()
	if row != nil {
		*row = recRow{}
		r.pool.Put(row)
	}
}

// fillRow copies what the request's end knows into row.
func fillRow(row *recRow, tok recToken, reqID string, in *inbound, ar *accessRecord) {
	*row = recRow{
		tok: tok, reqID: reqID, queue: ar.queued, ttft: ar.ttft, e2e: time.Since(ar.began),
		replica: ar.replica, outcome: ar.outcome, cached: -1, predicted: ar.predicted, input: 1,
	}
	if row.outcome == "" {
		row.outcome = "unknown"
	}
	if ar.cachedKnown {
		row.cached = ar.cachedTokens
	}
	if in == nil {
		return
	}
	m := in.m
	row.model, row.policy, row.priority = m.name, m.policyName(), in.req.Priority
	row.tenant = in.req.Tenant
	if in.f.User != nil {
		row.user, row.hasUser = *in.f.User, true
	}
	if in.ids != nil {
		row.input = max(len(in.ids), 1)
		row.blockSize, row.salt, row.hashes, row.ids = m.blockSize, in.salt, in.req.BlockHashes, in.ids
	} else {
		row.input = max(in.req.PromptTokens, 1)
	}
	if row.outcome == "ok" {
		row.output = ar.outputTokens
	} else {
		row.output = in.req.MaxTokens
	}
}

// heldRow is a record waiting to be written in arrival order.
type heldRow struct {
	at  int64 // arrival, Unix ns
	rec traces.Record
}

type rowHeap []heldRow

func (h rowHeap) Len() int           { return len(h) }
func (h rowHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h rowHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *rowHeap) Push(x any)        { *h = append(*h, x.(heldRow)) }
func (h *rowHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = heldRow{}
	*h = old[:len(old)-1]
	return x
}

// recFile is the file being written.
type recFile struct {
	f            *os.File
	w            *traces.ParquetWriter
	name         string // the final name; f is name+".partial"
	origin       int64  // Unix ns of arrival 0
	opened       time.Time
	groupStarted time.Time // when the row group being written got its first row
	lastAt       int64     // the latest arrival written
	counted      int64     // rows counted as written
	drops0       int64     // dropsMark when the file was started
	reordered    int64
}

// tickEvery is how often the writer looks at the time: a fraction of the
// shortest interval it keeps, within [10ms, 1s].
func (r *trafficRecorder) tickEvery() time.Duration {
	return min(max(min(r.cfg.FlushInterval, r.cfg.RotateInterval)/4, 10*time.Millisecond), time.Second)
}

// recBatch is how many rows wait for the writer before a request wakes it
// (kick). It never waits on the channel itself, so a row's send does not
// ready it: a wake-up per request was 2.5% of the proxy's CPU at 1,000
// req/s, half of what recording cost, and a timer's wake-up while the proxy
// idles costs a context switch. Rows also go at each tick (tickEvery, at
// most a second apart), and a channel half full wakes it at once, so
// record.buffer bounds the rows waiting as before.
const recBatch = 64

// run is the writer goroutine.
func (r *trafficRecorder) run() {
	defer close(r.done)
	tick := time.NewTicker(r.tickEvery())
	defer tick.Stop()
	for {
		select {
		case <-r.kick:
			r.drain()
		case now := <-tick.C:
			r.drain()
			r.maintain(now)
		case <-r.stop:
			// No row is sent once stop is closed: take what is queued.
			r.drain()
			r.writeReady(true)
			r.closeFile()
			return
		}
	}
}

// drain accepts the rows sent so far, each as it came (writing what it
// makes ready, so that no more than record.buffer are ever held).
func (r *trafficRecorder) drain() {
	n := len(r.ch)
	for range n {
		r.accept(<-r.ch)
		r.writeReady(false)
	}
	if n == 0 {
		r.writeReady(false) // the watermark may have moved on
	}
}

// accept turns a row into a record, held until it can be written in order.
func (r *trafficRecorder) accept(row *recRow) {
	rec := traces.Record{
		Model: row.model, Priority: row.priority, InputTokens: row.input, OutputTokens: max(row.output, 0),
		Measured: &traces.Measured{
			Queue: max(row.queue, 0), TTFT: max(row.ttft, 0), E2E: max(row.e2e, 0), Replica: row.replica, Outcome: row.outcome,
			CachedTokens: max(row.cached, -1), PredictedCachedTokens: max(row.predicted, 0), Policy: row.policy,
		},
	}
	if i := strings.LastIndexByte(row.reqID, '-'); i >= 0 {
		rec.ID, _ = strconv.ParseUint(row.reqID[i+1:], 36, 64)
	}
	if ids := r.keys.hashIDs(row); ids != nil {
		rec.BlockSize, rec.HashIDs = row.blockSize, ids
	}
	if row.tenant != "" {
		rec.Measured.Tenant = r.keys.identity('t', row.tenant)
	}
	if row.hasUser {
		rec.Session = r.keys.identity('u', row.user)
	}
	if m := rec.Measured; row.outcome == "ok" && rec.OutputTokens >= 2 && m.TTFT > 0 && m.E2E > m.TTFT {
		m.TPOT = (m.E2E - m.TTFT) / time.Duration(rec.OutputTokens-1)
	}
	at := row.tok.at
	r.mu.Lock()
	r.arrived(row.tok.idx)
	r.mu.Unlock()
	*row = recRow{}
	r.pool.Put(row)
	heap.Push(&r.held, heldRow{at: at, rec: rec})
}

// writeReady writes the held rows that no request in flight arrived
// before (all of them with all), and the oldest ones beyond buffer.
func (r *trafficRecorder) writeReady(all bool) {
	wm := int64(math.MaxInt64)
	if !all {
		wm = r.watermark()
	}
	for len(r.held) > 0 && (r.held[0].at <= wm || len(r.held) > r.cfg.Buffer) {
		r.write(heap.Pop(&r.held).(heldRow))
	}
}

// write appends one record to the current file, starting one when none is
// open.
func (r *trafficRecorder) write(h heldRow) {
	now := time.Now()
	if r.file == nil {
		if !r.failedAt.IsZero() && now.Sub(r.failedAt) < r.cfg.FlushInterval {
			r.drop("write_error", nil) // the last try failed just now
			return
		}
		if err := r.startFile(now, h.at); err != nil {
			r.failedAt = now
			r.log.Error("record: cannot start a recording file; rows are dropped until one starts", "error", err.Error())
			r.drop("write_error", nil)
			return
		}
	}
	f := r.file
	if h.at < f.lastAt {
		// Its request outlived the reorder buffer: written at the latest
		// arrival so the file stays in order.
		h.at = f.lastAt
		f.reordered++
	}
	f.lastAt = h.at
	h.rec.Arrival = time.Duration(h.at - f.origin)
	if n, _ := f.w.Buffered(); n == 0 {
		f.groupStarted = now
	}
	if err := f.w.Write(h.rec); err != nil {
		r.fail(err)
		return
	}
	r.countWritten()
	if _, b := f.w.Buffered(); f.w.Size()+b >= int64(r.cfg.RotateBytes) {
		r.closeFile()
	}
}

// maintain ends the row group past flush_interval and the file past
// rotate_interval.
func (r *trafficRecorder) maintain(now time.Time) {
	f := r.file
	if f == nil {
		return
	}
	if now.Sub(f.opened) >= r.cfg.RotateInterval {
		r.closeFile()
		return
	}
	if n, _ := f.w.Buffered(); n > 0 && now.Sub(f.groupStarted) >= r.cfg.FlushInterval {
		if err := f.w.Flush(); err != nil {
			r.fail(err)
			return
		}
		r.countWritten()
	}
}

// countWritten counts the rows the file's writer has written out since the
// last call.
func (r *trafficRecorder) countWritten() {
	f := r.file
	if n := f.w.Rows(); n > f.counted {
		r.written.Add(float64(n - f.counted))
		f.counted = n
	}
}

// fileName is the name of the seq-th file, started at t.
func (r *trafficRecorder) fileName(t time.Time, seq int) string {
	return fmt.Sprintf("%s-%s-%06d.parquet", r.stem, t.UTC().Format("20060102T150405Z"), seq)
}

// startFile starts the next file, whose arrival 0 is origin.
func (r *trafficRecorder) startFile(now time.Time, origin int64) error {
	var f *os.File
	var name string
	for {
		r.seq++
		name = r.fileName(now, r.seq)
		if _, err := os.Stat(name); err == nil {
			continue // a file of an earlier run
		}
		var err error
		f, err = os.OpenFile(name+".partial", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	fleet, policy, block := r.fleet()
	meta := traces.RecordingMeta{
		Start: time.Unix(0, origin).UTC(), SaltFingerprint: r.keys.fingerprint, Sample: r.cfg.Sample,
		Fleet: fleet, Policy: policy, BlockSize: block, Sequence: r.seq, Gateway: r.version, Dropped: -1, Reordered: -1,
	}
	w, err := traces.NewParquetWriterOptions(f, traces.ParquetWriterOptions{Metadata: meta.Metadata(), RowGroupRows: recordRowGroup})
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	r.file = &recFile{f: f, w: w, name: name, origin: origin, opened: now, lastAt: origin, drops0: r.dropsMark}
	r.failedAt = time.Time{}
	return nil
}

// fail ends the current file after a write error: the rows of its row
// group being written are dropped; what it checkpointed stays readable.
func (r *trafficRecorder) fail(err error) {
	f := r.file
	r.log.Error("record: writing the recording failed; the file is closed as it is (readable up to its last complete row group)", "file", f.name, "error", err.Error())
	if n, _ := f.w.Buffered(); n > 0 {
		r.dropsAll.Add(int64(n))
		r.dropped["write_error"].Add(float64(n))
	}
	f.f.Close()
	r.publish(f)
	r.file = nil
	r.failedAt = time.Now()
	r.dropsMark = r.dropsAll.Load()
}

// closeFile completes the current file (its footer, with the counts of
// what it left out) and renames it to its final name.
func (r *trafficRecorder) closeFile() {
	f := r.file
	if f == nil {
		return
	}
	r.file = nil
	r.dropsMark = r.dropsAll.Load()
	f.w.SetMetadata(traces.MetaRecordDropped, strconv.FormatInt(r.dropsMark-f.drops0, 10))
	f.w.SetMetadata(traces.MetaRecordReordered, strconv.FormatInt(f.reordered, 10))
	err := f.w.Close()
	if err == nil {
		err = f.f.Sync()
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.file = f
		r.fail(err)
		r.file = nil
		return
	}
	if n := f.w.Rows(); n > f.counted {
		r.written.Add(float64(n - f.counted))
	}
	r.files.Inc()
	r.publish(f)
}

// publish renames a file to its final name.
func (r *trafficRecorder) publish(f *recFile) {
	if err := os.Rename(f.f.Name(), f.name); err != nil {
		r.log.Error("record: cannot rename the recording file", "file", f.f.Name(), "error", err.Error())
	}
}

// close stops recording: rows of requests still to end are dropped, what
// is held is written and the last file completed, within
// recordCloseTimeout.
func (r *trafficRecorder) close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	close(r.stop)
	t := time.NewTimer(recordCloseTimeout)
	defer t.Stop()
	select {
	case <-r.done:
		return nil
	case <-t.C:
		return fmt.Errorf("record: the last recording file was not written within %v", recordCloseTimeout)
	}
}

// recordFleet is what a recording file says of the fleet: each model's
// replicas as the core knows them now, its policy and block size.
func (s *Server) recordFleet() (fleet map[string][]string, policy map[string]string, block map[string]int) {
	fleet, policy, block = map[string][]string{}, map[string]string{}, map[string]int{}
	for _, m := range s.models {
		names := []string{}
		for _, rs := range m.snapshot().reps {
			names = append(names, rs.rep.name)
		}
		fleet[m.name], policy[m.name], block[m.name] = names, m.policyName(), m.blockSize
	}
	return fleet, policy, block
}

// outcomeOf counts a request's outcome (inferrail_requests_total) and
// keeps it for the request's row.
func (s *Server) outcomeOf(ar *accessRecord, model, o string) {
	s.met.outcome(model, o)
	ar.outcome = o
}
