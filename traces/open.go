package traces

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Counter is implemented by every reader of this package: Skipped reports how
// many malformed records it has skipped so far under Options.SkipBad.
type Counter interface {
	Skipped() int
}

// The format names Open and Detect use.
const (
	formatMooncake = "mooncake"
	formatBailian  = "bailian"
	formatAzure    = "azure"
	formatBurstGPT = "burstgpt"
	formatShareGPT = "sharegpt"
	formatVLLMLog  = "vllm-log"
	formatParquet  = "parquet"
)

// Formats lists the trace formats Open reads, in a stable order.
func Formats() []string {
	return []string{formatMooncake, formatBailian, formatAzure, formatBurstGPT, formatShareGPT, formatVLLMLog, formatParquet}
}

// Detect guesses a trace's format from its path: a directory holding
// requests.jsonl is a vLLM log, .parquet is the project's parquet format, and
// otherwise the first line decides: a JSON object with chat_id is Bailian,
// one with hash_ids or input_length (Mooncake's millisecond timestamps look
// like Bailian's seconds, so the keys decide) is Mooncake, one with
// input_toks is a vLLM requests.jsonl, one with conversations (or a JSON
// array) is ShareGPT; a CSV header with ContextTokens is Azure, one with
// Request tokens is BurstGPT. A .gz suffix is looked through.
func Detect(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("detect trace format: %w", err)
	}
	if st.IsDir() {
		if _, err := os.Stat(filepath.Join(path, vllmRequestsFile)); err != nil {
			return "", fmt.Errorf("detect trace format: directory %s has no %s", path, vllmRequestsFile)
		}
		return formatVLLMLog, nil
	}
	if strings.HasSuffix(strings.ToLower(path), ".parquet") {
		return formatParquet, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("detect trace format: %w", err)
	}
	defer f.Close()
	r, closer, err := maybeGunzip(f, path)
	if err != nil {
		return "", fmt.Errorf("detect trace format: %w", err)
	}
	defer closer.Close()
	format, err := detectContent(bufio.NewReaderSize(r, 64<<10))
	if err != nil {
		return "", fmt.Errorf("detect trace format of %s: %w", path, err)
	}
	return format, nil
}

// detectContent decides a format from the start of a file.
func detectContent(br *bufio.Reader) (string, error) {
	// Skip a byte order mark and leading white space.
	if b, err := br.Peek(3); err == nil && bytes.Equal(b, utf8BOM) {
		_, _ = br.Discard(3)
	}
	for {
		c, err := br.ReadByte()
		if err != nil {
			return "", errors.New("no data to recognise")
		}
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			_ = br.UnreadByte()
			break
		}
	}
	// Look at the first line, and at up to 64 KiB for a pretty-printed object.
	window, _ := br.Peek(br.Size())
	first := window[0]
	if first == '[' {
		return formatShareGPT, nil
	}
	line := window
	if i := bytes.IndexByte(window, '\n'); i >= 0 {
		line = window[:i]
	}
	if first == '{' {
		var keys map[string]json.RawMessage
		if json.Unmarshal(line, &keys) != nil {
			// A pretty-printed object spans lines: look for its keys instead.
			keys = map[string]json.RawMessage{}
			for _, k := range []string{"chat_id", "hash_ids", "input_length", "input_toks", "conversations"} {
				if bytes.Contains(window, []byte(`"`+k+`"`)) {
					keys[k] = nil
				}
			}
		}
		_, chat := keys["chat_id"]
		_, hashes := keys["hash_ids"]
		_, input := keys["input_length"]
		_, toks := keys["input_toks"]
		_, conv := keys["conversations"]
		switch {
		case chat:
			return formatBailian, nil
		case hashes || input:
			return formatMooncake, nil
		case toks:
			return formatVLLMLog, nil
		case conv:
			return formatShareGPT, nil
		}
		return "", errors.New("a JSON object of no known trace format")
	}
	header := strings.Split(string(line), ",")
	for _, h := range header {
		switch normalizeColumn(h) {
		case "contexttokens":
			return formatAzure, nil
		case "requesttokens":
			return formatBurstGPT, nil
		}
	}
	return "", errors.New("neither JSON nor a CSV header of a known trace format")
}

// Open opens a trace file in the given format, or the one Detect finds when
// format is "". For vllm-log, path is the log's directory or its
// requests.jsonl (meta.json is looked for beside it). Files ending in .gz
// are decompressed (not parquet). The returned Closer releases the file;
// close it after the last Next. Every reader it returns implements Counter.
// A line longer than 64 MiB ends a JSON-lines read with an error.
func Open(path, format string, opts Options) (Reader, io.Closer, error) {
	if format == "" {
		f, err := Detect(path)
		if err != nil {
			return nil, nil, err
		}
		format = f
	}
	switch format {
	case formatVLLMLog:
		requests, meta := filepath.Join(path, vllmRequestsFile), filepath.Join(path, vllmMetaFile)
		if st, err := os.Stat(path); err == nil && !st.IsDir() {
			// A requests.jsonl by another name: meta.json is beside it.
			requests, meta = path, filepath.Join(filepath.Dir(path), vllmMetaFile)
		}
		r, _, err := openVLLM(requests, meta, opts)
		if err != nil {
			return nil, nil, err
		}
		return r, r, nil
	case formatParquet:
		r, err := NewParquet(path, opts)
		if err != nil {
			return nil, nil, err
		}
		if c, ok := r.(io.Closer); ok {
			return r, c, nil
		}
		return r, nopCloser{}, nil
	case formatMooncake, formatBailian, formatAzure, formatBurstGPT, formatShareGPT:
	default:
		return nil, nil, fmt.Errorf("unknown trace format %q (want one of %s)", format, strings.Join(Formats(), ", "))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open trace: %w", err)
	}
	in, closer, err := maybeGunzip(f, path)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("open trace: %w", err)
	}
	name := path
	var r Reader
	switch format {
	case formatMooncake:
		r = NewMooncake(in, name, opts)
	case formatBailian:
		r = NewBailian(in, name, opts)
	case formatAzure:
		r = NewAzure(in, name, opts)
	case formatBurstGPT:
		r = NewBurstGPT(in, name, opts)
	case formatShareGPT:
		r = NewShareGPT(in, name, opts)
	}
	return r, closer, nil
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// multiCloser closes a decompressor, then its file.
type multiCloser []io.Closer

func (m multiCloser) Close() error {
	var errs []error
	for _, c := range m {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// maybeGunzip wraps f in a gzip reader when path ends in .gz; the closer
// closes both.
func maybeGunzip(f *os.File, path string) (io.Reader, io.Closer, error) {
	if !strings.HasSuffix(strings.ToLower(path), ".gz") {
		return f, f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return z, multiCloser{z, f}, nil
}

// Limits beyond which a number in a trace is taken for garbage.
const (
	// maxTokens bounds token counts.
	maxTokens = 1_000_000_000
	// maxArrivalSeconds bounds how far after the first record one may arrive
	// (about 31 years), well inside time.Duration.
	maxArrivalSeconds = 1e9
	// maxLine is the longest line the JSON-lines readers accept.
	maxLine = 64 << 20
)

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// badf makes an error that marks a record bad.
func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, args...))
}

// tokenCount checks a token count: present, integral, 0..maxTokens.
func tokenCount(field string, v *float64) (int, error) {
	if v == nil {
		return 0, badf("missing %s", field)
	}
	return checkCount(field, *v)
}

func checkCount(field string, f float64) (int, error) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return 0, badf("%s is %v", field, f)
	case f < 0:
		return 0, badf("%s %v is negative", field, f)
	case f > maxTokens:
		return 0, badf("%s %v exceeds %d", field, f, maxTokens)
	case f != math.Trunc(f):
		return 0, badf("%s %v is not a whole number", field, f)
	}
	return int(f), nil
}

// parseCount reads a token count from CSV text: "374", or "374.0".
func parseCount(field, s string) (int, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > maxTokens {
			return 0, badf("%s %d out of range 0..%d", field, n, maxTokens)
		}
		return int(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, badf("%s %q is not a number", field, s)
	}
	return checkCount(field, f)
}

// parseSeconds reads a finite number from CSV text.
func parseSeconds(field, s string) (float64, error) {
	s = strings.TrimSpace(s)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, badf("%s %q is not a number", field, s)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, badf("%s is %v", field, f)
	}
	return f, nil
}

// clock turns absolute timestamps into arrivals relative to the first
// record a reader returns.
type clock struct {
	unit time.Duration // one timestamp unit
	base float64
	set  bool
}

// arrival is ts relative to the first accepted timestamp (ts itself when none
// was accepted yet); accept makes ts the base when it is the first.
func (c *clock) arrival(field string, ts *float64) (time.Duration, error) {
	if ts == nil {
		return 0, badf("missing %s", field)
	}
	if math.IsNaN(*ts) || math.IsInf(*ts, 0) {
		return 0, badf("%s is %v", field, *ts)
	}
	base := *ts
	if c.set {
		base = c.base
	}
	secs := (*ts - base) * c.unit.Seconds()
	if math.IsInf(secs, 0) || math.Abs(secs) > maxArrivalSeconds {
		return 0, badf("%s %v is absurdly far from the trace's first record (%v)", field, *ts, base)
	}
	return time.Duration(math.Round(secs * 1e9)), nil
}

func (c *clock) accept(ts float64) {
	if !c.set {
		c.base, c.set = ts, true
	}
}

// checkBlocks checks block ids against the input length: when present they
// must number ceil(input/blockSize). Record.Validate checks the same for
// non-empty lists; this also rejects an empty one.
func checkBlocks(ids []uint64, input, blockSize int) error {
	if ids == nil || input <= 0 {
		return nil
	}
	if need := (input + blockSize - 1) / blockSize; len(ids) != need {
		return badf("%d hash ids for %d input tokens in blocks of %d (want %d)", len(ids), input, blockSize, need)
	}
	return nil
}

// parseJSONUint reads a non-negative JSON integer literal (not a string).
func parseJSONUint(field string, raw json.RawMessage) (uint64, error) {
	s := string(bytes.TrimSpace(raw))
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		// Accept integral floats such as 159.0 that exporters write.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || len(s) == 0 || s[0] == '"' || f < 0 || f != math.Trunc(f) || f >= 1<<53 {
			return 0, badf("%s %s is not a non-negative integer", field, s)
		}
		return uint64(f), nil
	}
	return n, nil
}

// hashString maps a string id to a stable uint64 (FNV-1a, 64 bits).
func hashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// normalizeColumn folds a CSV column name for lookup: lower case, without a
// byte order mark, spaces, underscores or dashes.
func normalizeColumn(s string) string {
	s = strings.TrimPrefix(s, "\ufeff")
	s = strings.ToLower(s)
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '_', '-', '\t', '\r', '\n', '"':
			return -1
		}
		return r
	}, s)
}

// lineReader drives the JSON-lines readers: it scans lines, skips blank
// ones, and applies SkipBad to the parse errors of the others.
type lineReader struct {
	sc      *bufio.Scanner
	name    string
	skipBad bool
	parse   func(line []byte, n int) (Record, error)
	line    int
	skipped int
	err     error // final error, returned again by every later Next
}

func newLineReader(r io.Reader, name string, opts Options, parse func([]byte, int) (Record, error)) *lineReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	return &lineReader{sc: sc, name: name, skipBad: opts.SkipBad, parse: parse}
}

// nextLine returns the next non-blank line and its 1-based number.
func (l *lineReader) nextLine() ([]byte, int, error) {
	for l.err == nil {
		if !l.sc.Scan() {
			switch err := l.sc.Err(); {
			case err == nil:
				l.err = io.EOF
			case errors.Is(err, bufio.ErrTooLong):
				l.err = &LineError{File: l.name, Line: l.line + 1, Err: fmt.Errorf("line longer than %d bytes", maxLine)}
			default:
				l.err = fmt.Errorf("%s: read: %w", l.name, err)
			}
			break
		}
		l.line++
		b := l.sc.Bytes()
		if l.line == 1 {
			b = bytes.TrimPrefix(b, utf8BOM)
		}
		if b = bytes.TrimSpace(b); len(b) > 0 {
			return b, l.line, nil
		}
	}
	return nil, 0, l.err
}

// Next returns the next record that parses, skipping bad ones under SkipBad.
// After a *LineError wrapping ErrBadRecord, Next may be called again to go on
// with the following line.
func (l *lineReader) Next() (Record, error) {
	for {
		b, n, err := l.nextLine()
		if err != nil {
			return Record{}, err
		}
		rec, err := l.parse(b, n)
		if err == nil {
			return rec, nil
		}
		if l.skipBad && errors.Is(err, ErrBadRecord) {
			l.skipped++
			continue
		}
		return Record{}, &LineError{File: l.name, Line: n, Err: err}
	}
}

// Skipped implements Counter.
func (l *lineReader) Skipped() int { return l.skipped }

// jsonBad wraps a JSON decoding error of one line as a bad record.
func jsonBad(err error) error {
	return fmt.Errorf("%w: invalid JSON: %w", ErrBadRecord, err)
}

// csvReader drives the CSV readers: it reads the header, finds columns by
// name, and applies SkipBad to the rows parse rejects.
type csvReader struct {
	cr      *csv.Reader
	name    string
	skipBad bool
	// required names the columns parse needs, as normalizeColumn folds them;
	// cols maps every header name to its index once the header is read.
	required []string
	cols     map[string]int
	width    int
	parse    func(row []string, line int) (Record, error)
	skipped  int
	err      error // final error, returned again by every later Next
}

func newCSVReader(r io.Reader, name string, opts Options, required ...string) *csvReader {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	cr.TrimLeadingSpace = true
	return &csvReader{cr: cr, name: name, skipBad: opts.SkipBad, required: required}
}

// col returns the row's value in a column, "" when the header lacks it.
func (c *csvReader) col(row []string, name string) string {
	i, ok := c.cols[name]
	if !ok || i >= len(row) {
		return ""
	}
	return row[i]
}

// has reports whether the header named a column.
func (c *csvReader) has(name string) bool {
	_, ok := c.cols[name]
	return ok
}

func (c *csvReader) header() error {
	row, err := c.cr.Read()
	if err != nil {
		var pe *csv.ParseError
		switch {
		case errors.Is(err, io.EOF):
			return io.EOF
		case errors.As(err, &pe):
			return &LineError{File: c.name, Line: pe.StartLine, Err: fmt.Errorf("header: %w", pe.Err)}
		}
		return fmt.Errorf("%s: read: %w", c.name, err)
	}
	c.cols = make(map[string]int, len(row))
	for i, h := range row {
		if _, dup := c.cols[normalizeColumn(h)]; !dup {
			c.cols[normalizeColumn(h)] = i
		}
	}
	c.width = len(row)
	for _, name := range c.required {
		if !c.has(name) {
			return &LineError{File: c.name, Line: 1, Err: fmt.Errorf("header %q lacks column %s", strings.Join(row, ","), name)}
		}
	}
	return nil
}

// Next returns the next record that parses, skipping bad rows under SkipBad.
// After a *LineError wrapping ErrBadRecord, Next may be called again to go on
// with the following row.
func (c *csvReader) Next() (Record, error) {
	if c.cols == nil && c.err == nil {
		if err := c.header(); err != nil {
			c.err = err
		}
	}
	for c.err == nil {
		row, err := c.cr.Read()
		var pe *csv.ParseError
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			c.err = io.EOF
			continue
		case errors.As(err, &pe):
			if err := c.bad(pe.StartLine, fmt.Errorf("%w: %w", ErrBadRecord, pe.Err)); err != nil {
				return Record{}, err
			}
			continue
		default:
			c.err = fmt.Errorf("%s: read: %w", c.name, err)
			continue
		}
		line, _ := c.cr.FieldPos(0)
		if len(row) == 1 && strings.TrimSpace(row[0]) == "" {
			continue // a blank line
		}
		if len(row) != c.width {
			err = badf("%d fields, the header has %d", len(row), c.width)
		} else {
			var rec Record
			if rec, err = c.parse(row, line); err == nil {
				return rec, nil
			}
		}
		if err := c.bad(line, err); err != nil {
			return Record{}, err
		}
	}
	return Record{}, c.err
}

// bad skips a bad row under SkipBad (returning nil) or names it.
func (c *csvReader) bad(line int, err error) error {
	if c.skipBad && errors.Is(err, ErrBadRecord) {
		c.skipped++
		return nil
	}
	return &LineError{File: c.name, Line: line, Err: err}
}

// Skipped implements Counter.
func (c *csvReader) Skipped() int { return c.skipped }
