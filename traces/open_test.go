package traces

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// sharedTraces is where the real public traces live, relative to this
// package's directory; tests that need them skip when it is absent.
const sharedTraces = "../../shared/traces"

// sharedPath returns a file or directory under sharedTraces, skipping the
// test when it is absent.
func sharedPath(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join(sharedTraces, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("real trace %s not present (%v): these tests read the public traces from ../shared/traces next to the repository", p, err)
	}
	return p
}

// readAll reads every record of r, stopping at the first error.
func readAll(r Reader) ([]Record, error) {
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
}

// mustReadAll reads every record of r and fails the test on any error.
func mustReadAll(t *testing.T, r Reader) []Record {
	t.Helper()
	recs, err := readAll(r)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return recs
}

// openTestdata opens a file of testdata.
func openTestdata(t *testing.T, name string) io.Reader {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// checkRecords compares records with the expected ones.
func checkRecords(t *testing.T, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(got), len(want), got)
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("record %d:\n got  %+v\n want %+v", i, got[i], want[i])
		}
	}
}

// wantLineError checks that err is a *LineError for file:line that wraps
// ErrBadRecord (bad) or not, and mentions substr.
func wantLineError(t *testing.T, err error, file string, line int, bad bool, substr string) {
	t.Helper()
	var le *LineError
	if !errors.As(err, &le) {
		t.Fatalf("error %v (%T) is not a *LineError", err, err)
	}
	if le.File != file || le.Line != line {
		t.Errorf("error %v names %s:%d, want %s:%d", err, le.File, le.Line, file, line)
	}
	if errors.Is(err, ErrBadRecord) != bad {
		t.Errorf("error %v: wraps ErrBadRecord = %v, want %v", err, !bad, bad)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("error %q does not mention %q", err, substr)
	}
}

// drain reads r to its end the way a fuzz target checks readers: it must
// not panic, every record must validate, every error must be a *LineError
// naming file (bad records are stepped over, other errors must repeat), and
// it returns the records and how many bad-record errors it stepped over.
func drain(t *testing.T, r Reader, file string) ([]Record, int) {
	t.Helper()
	var recs []Record
	bad := 0
	for i := 0; ; i++ {
		if i > 1_000_000 {
			t.Fatal("reader does not end")
		}
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			if _, err2 := r.Next(); !errors.Is(err2, io.EOF) {
				t.Fatalf("after io.EOF, Next returned %v", err2)
			}
			return recs, bad
		}
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) || le.File != file || le.Line < 1 || le.Err == nil {
				t.Fatalf("error %v (%T) is not a *LineError naming %s and a line", err, err, file)
			}
			if errors.Is(err, ErrBadRecord) {
				bad++
				continue
			}
			if _, err2 := r.Next(); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("final error %v not repeated: %v", err, err2)
			}
			return recs, bad
		}
		if err := rec.Validate(); err != nil {
			t.Fatalf("record %+v does not validate: %v", rec, err)
		}
		recs = append(recs, rec)
	}
}

// checkSkipping reads the same input strictly and with SkipBad: the skipping
// reader must return the same records and count as skipped exactly the bad
// records the strict one reported.
func checkSkipping(t *testing.T, data []byte, newReader func(io.Reader, string, Options) Reader) {
	t.Helper()
	const file = "fuzz.in"
	strict, bad := drain(t, newReader(bytes.NewReader(data), file, Options{}), file)
	r := newReader(bytes.NewReader(data), file, Options{SkipBad: true})
	skipping, bad2 := drain(t, r, file)
	if bad2 != 0 {
		t.Fatalf("SkipBad reader returned %d bad-record errors", bad2)
	}
	if got := r.(Counter).Skipped(); got != bad {
		t.Fatalf("Skipped() = %d, the strict reader reported %d bad records", got, bad)
	}
	if !reflect.DeepEqual(strict, skipping) {
		t.Fatalf("records differ with SkipBad:\n strict   %+v\n skipping %+v", strict, skipping)
	}
}

func TestFormats(t *testing.T) {
	want := []string{"mooncake", "bailian", "azure", "burstgpt", "sharegpt", "vllm-log", "parquet"}
	if got := Formats(); !slices.Equal(got, want) {
		t.Errorf("Formats() = %v, want %v", got, want)
	}
}

func TestDetect(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gz := filepath.Join(dir, "trace.jsonl.gz")
	{
		var b bytes.Buffer
		z := gzip.NewWriter(&b)
		_, _ = z.Write([]byte(`{"chat_id": 1, "timestamp": 0, "input_length": 3, "output_length": 1}` + "\n"))
		_ = z.Close()
		if err := os.WriteFile(gz, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ path, want string }{
		{"testdata/mooncake.jsonl", "mooncake"},
		{"testdata/bailian.jsonl", "bailian"},
		{"testdata/azure.csv", "azure"},
		{"testdata/burstgpt.csv", "burstgpt"},
		{"testdata/burstgpt_v1.csv", "burstgpt"},
		{"testdata/sharegpt.json", "sharegpt"},
		{"testdata/vllm-log", "vllm-log"},
		{"testdata/vllm-log/requests.jsonl", "vllm-log"},
		{gz, "bailian"},
		{write("x.parquet", "PAR1"), "parquet"},
		{write("sharegpt.jsonl", `{"id": "x", "conversations": []}`), "sharegpt"},
		{write("bom.csv", "\ufeffTimestamp,Request tokens,Response tokens\n1,2,3\n"), "burstgpt"},
		{write("pretty.json", "  {\n \"timestamp\": 1,\n \"input_length\": 5, \"output_length\": 1}"), "mooncake"},
	} {
		got, err := Detect(tc.path)
		if err != nil || got != tc.want {
			t.Errorf("Detect(%s) = %q, %v; want %q", tc.path, got, err, tc.want)
		}
	}
	for _, p := range []string{
		write("empty.jsonl", ""),
		write("other.csv", "a,b,c\n1,2,3\n"),
		write("other.jsonl", `{"a": 1}`),
		filepath.Join(dir, "missing.jsonl"),
		dir, // a directory without requests.jsonl
	} {
		if got, err := Detect(p); err == nil {
			t.Errorf("Detect(%s) = %q, want an error", p, got)
		}
	}
}

func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		path, format string
		n            int
	}{
		{"testdata/mooncake.jsonl", "", 3},
		{"testdata/bailian.jsonl", "bailian", 6},
		{"testdata/azure.csv", "", 4},
		{"testdata/burstgpt.csv", "", 3},
		{"testdata/sharegpt.json", "", 4},
		{"testdata/vllm-log", "", 3},
		{"testdata/vllm-log/requests.jsonl", "vllm-log", 3},
	} {
		r, c, err := Open(tc.path, tc.format, Options{Model: "m"})
		if err != nil {
			t.Fatalf("Open(%s, %q): %v", tc.path, tc.format, err)
		}
		recs := mustReadAll(t, r)
		if len(recs) != tc.n {
			t.Errorf("Open(%s): %d records, want %d", tc.path, len(recs), tc.n)
		}
		if _, ok := r.(Counter); !ok {
			t.Errorf("Open(%s): reader %T is no Counter", tc.path, r)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	// A bad record names the path Open was given.
	_, _, err := Open("testdata/burstgpt_v1.csv", "burstgpt", Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, c, _ := Open("testdata/burstgpt_v1.csv", "burstgpt", Options{})
	defer c.Close()
	_, err = readAll(r)
	wantLineError(t, err, "testdata/burstgpt_v1.csv", 3, true, "input length 0")
}

func TestOpenErrors(t *testing.T) {
	_, _, err := Open("testdata/mooncake.jsonl", "csv", Options{})
	if err == nil || !strings.Contains(err.Error(), strings.Join(Formats(), ", ")) {
		t.Errorf("unknown format: error %v does not list the formats", err)
	}
	if _, _, err := Open("testdata/missing.jsonl", "mooncake", Options{}); err == nil {
		t.Error("missing file: no error")
	}
	if _, _, err := Open("testdata/missing", "", Options{}); err == nil {
		t.Error("missing file, detected: no error")
	}
	if _, _, err := Open("testdata", "vllm-log", Options{}); err == nil {
		t.Error("directory without requests.jsonl: no error")
	}
}

func TestOpenGzip(t *testing.T) {
	b, err := os.ReadFile("testdata/azure.csv")
	if err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(b)
	_ = zw.Close()
	p := filepath.Join(t.TempDir(), "azure.csv.gz")
	if err := os.WriteFile(p, z.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	r, c, err := Open(p, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if recs := mustReadAll(t, r); len(recs) != 4 {
		t.Errorf("%d records, want 4", len(recs))
	}
}

func TestOpenParquet(t *testing.T) {
	p := filepath.Join(t.TempDir(), "trace.parquet")
	if _, err := WriteParquetFile(p, NewMooncake(openTestdata(t, "mooncake.jsonl"), "mooncake.jsonl", Options{})); err != nil {
		t.Fatal(err)
	}
	r, c, err := Open(p, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := mustReadAll(t, NewMooncake(openTestdata(t, "mooncake.jsonl"), "mooncake.jsonl", Options{}))
	got := mustReadAll(t, r)
	if len(got) != len(want) {
		t.Fatalf("%d records from parquet, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].Arrival != want[i].Arrival || !slices.Equal(got[i].HashIDs, want[i].HashIDs) {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestDetectRealTraces(t *testing.T) {
	for rel, want := range map[string]string{
		"mooncake/conversation_trace.jsonl":         "mooncake",
		"azure2023/AzureLLMInferenceTrace_conv.csv": "azure",
		"vllm-logs/RTX4090-Llama-3.1-8B":            "vllm-log",
	} {
		p := sharedPath(t, rel)
		if got, err := Detect(p); err != nil || got != want {
			t.Errorf("Detect(%s) = %q, %v; want %q", p, got, err, want)
		}
	}
}

func TestArrivalClock(t *testing.T) {
	c := &clock{unit: time.Millisecond}
	ts := 3536999.0
	d, err := c.arrival("timestamp", &ts)
	if err != nil || d != 0 {
		t.Fatalf("first arrival %v, %v; want 0", d, err)
	}
	c.accept(1000)
	if d, _ := c.arrival("timestamp", &ts); d != 3535999*time.Millisecond {
		t.Errorf("arrival %v, want 3535.999s", d)
	}
	huge := 1e300
	if _, err := c.arrival("timestamp", &huge); !errors.Is(err, ErrBadRecord) {
		t.Errorf("absurd timestamp: %v", err)
	}
	if _, err := c.arrival("timestamp", nil); !errors.Is(err, ErrBadRecord) {
		t.Errorf("missing timestamp: %v", err)
	}
}

// genLines is an io.Reader of n generated lines, made as they are read.
type genLines struct {
	n, i int
	line func(i int) string
	buf  []byte
}

func (g *genLines) Read(p []byte) (int, error) {
	for len(g.buf) == 0 {
		if g.i >= g.n {
			return 0, io.EOF
		}
		g.buf = []byte(g.line(g.i))
		g.i++
	}
	n := copy(p, g.buf)
	g.buf = g.buf[n:]
	return n, nil
}

// TestManyRecords streams 250,000 records through the JSON-lines readers
// and checks that what stays in memory is small, so that a million-record
// file needs a few hundred MB at most: the Mooncake reader keeps nothing per
// record, the Bailian one a few tens of bytes (each chat's root).
func TestManyRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("250,000 records take a few seconds")
	}
	const n = 250_000
	for _, tc := range []struct {
		name      string
		reader    func(io.Reader, string, Options) Reader
		line      func(i int) string
		perRecord uint64 // bytes of heap per record still in use after the read
	}{
		{"mooncake", NewMooncake, func(i int) string {
			return fmt.Sprintf(`{"timestamp": %d, "input_length": 2000, "output_length": 100, "hash_ids": [0, %d, %d, %d]}`+"\n", i, i, i+1, i+2)
		}, 16},
		{"bailian", NewBailian, func(i int) string {
			return fmt.Sprintf(`{"chat_id": %d, "parent_chat_id": %d, "timestamp": %d.5, "input_length": 40, "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}`+"\n", i, i-1, i)
		}, 200},
	} {
		r := tc.reader(&genLines{n: n, line: tc.line}, tc.name, Options{})
		count := 0
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			count++
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if count != n || ms.HeapAlloc > tc.perRecord*n+(4<<20) {
			t.Errorf("%s: %d records, %d MB of heap in use after the read (want at most %d bytes a record)", tc.name, count, ms.HeapAlloc>>20, tc.perRecord)
		}
		runtime.KeepAlive(r)
		t.Logf("%s: %d records, %d MB heap in use while the reader lives", tc.name, count, ms.HeapAlloc>>20)
	}
}
