package compare

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// MaxShards bounds a shard count: more shards than jobs only leaves shards
// with nothing to do, and no batch system runs a million tasks of one job.
const MaxShards = 1 << 20

// Shard is one of Count parts of a plan's jobs: the jobs whose index j has
// j % Count == Index, Index counting from 0.
type Shard struct {
	Index, Count int
}

// String is the shard as ParseShard reads it, i/N.
func (s Shard) String() string { return fmt.Sprintf("%d/%d", s.Index, s.Count) }

// Has reports whether job j is the shard's.
func (s Shard) Has(j int) bool { return j%s.Count == s.Index }

// Validate checks the shard once.
func (s Shard) Validate() error {
	switch {
	case s.Count < 1 || s.Count > MaxShards:
		return fmt.Errorf("shard: the count must be from 1 to %d, got %d", MaxShards, s.Count)
	case s.Index < 0 || s.Index >= s.Count:
		return fmt.Errorf("shard: the index counts from 0, so with %d shards it must be from 0 to %d, got %d", s.Count, s.Count-1, s.Index)
	}
	return nil
}

// ParseShard reads i/N: shard i (from 0) of N, e.g. 0/4 to 3/4.
func ParseShard(v string) (Shard, error) {
	bad := func(why string) (Shard, error) {
		return Shard{}, fmt.Errorf("shard: want i/N, shard i (counting from 0) of N, e.g. 0/4 to 3/4; got %q: %s", v, why)
	}
	i, n, ok := strings.Cut(v, "/")
	if !ok {
		return bad("no /")
	}
	digits := func(s string) bool {
		return s != "" && len(s) <= 7 && strings.Trim(s, "0123456789") == ""
	}
	if !digits(i) {
		return bad("the index i must be a whole number from 0")
	}
	if !digits(n) {
		return bad("the count N must be a whole number from 1")
	}
	idx, _ := strconv.Atoi(i)
	cnt, _ := strconv.Atoi(n)
	s := Shard{Index: idx, Count: cnt}
	if err := s.Validate(); err != nil {
		return bad(strings.TrimPrefix(err.Error(), "shard: "))
	}
	return s, nil
}

// ShardOptions say which shard to run, and how.
type ShardOptions struct {
	Shard Shard
	// Parallel is the number of simulations run at once (0: GOMAXPROCS);
	// results do not depend on it.
	Parallel int
	// Version names the running build; it must be the plan's.
	Version string
	// Progress, when set, is called after each job this call runs is
	// stored.
	Progress func(done, total int)
}

// ShardReport says what RunShard did.
type ShardReport struct {
	Shard Shard
	// Planned is the number of jobs in the plan, Jobs the number in the
	// shard.
	Planned, Jobs int
	// Ran lists the jobs this call simulated and stored, ascending; Skipped
	// the jobs whose result this plan's shards had already stored.
	Ran, Skipped []int
	// Replaced names the result files that were not a valid result of this
	// plan (another plan's, another build's, unreadable), and why; their
	// jobs ran again.
	Replaced []string
}

// RunShard runs the jobs of one shard of the plan in dir and stores each
// job's point in dir/jobs as soon as it is simulated (JobFileName, written
// by rename). Jobs whose valid result is already there are skipped, so a
// shard stopped half-way (killed, or ctx cancelled) and started again
// finishes without redoing what it stored. When ctx is done no new job
// starts; the running ones finish and are stored. The report lists what
// ran, also when an error is returned.
func RunShard(ctx context.Context, dir string, o ShardOptions) (ShardReport, error) {
	rep := ShardReport{Shard: o.Shard}
	if err := o.Shard.Validate(); err != nil {
		return rep, err
	}
	if o.Parallel < 0 {
		return rep, fmt.Errorf("parallel: must be zero (all cores) or positive, got %d", o.Parallel)
	}
	p, err := LoadPlan(dir)
	if err != nil {
		return rep, err
	}
	rep.Planned = p.Len()
	if err := p.checkVersion(o.Version); err != nil {
		return rep, err
	}
	var source func(uint64) (workload.Source, error)
	if r := p.file.Replay; r != nil {
		if err := r.check(); err != nil {
			return rep, err
		}
		source = r.Source()
	}
	if err := os.MkdirAll(filepath.Join(dir, JobsDir), 0o755); err != nil {
		return rep, fmt.Errorf("create %s: %w", filepath.Join(dir, JobsDir), err)
	}
	var pending []int
	for j := o.Shard.Index; j < p.Len(); j += o.Shard.Count {
		rep.Jobs++
		_, err := readJobFile(dir, p, j)
		switch {
		case err == nil:
			rep.Skipped = append(rep.Skipped, j)
			continue
		case !errors.Is(err, fs.ErrNotExist):
			rep.Replaced = append(rep.Replaced, err.Error())
		}
		pending = append(pending, j)
	}
	var mu sync.Mutex
	keep := p.file.Spec.KeepRecords
	err = eachJob(ctx, len(pending), o.Parallel, o.Progress, func(k int) error {
		pj := &p.file.Jobs[pending[k]]
		c := fleet.Config(pj.Config)
		c.Source = source
		j := pj.job()
		pt, err := j.simulate(c, keep)
		if err != nil {
			return err
		}
		if err := writeJobFile(dir, p, pj.Index, o.Shard, pt); err != nil {
			return err
		}
		mu.Lock()
		rep.Ran = append(rep.Ran, pj.Index)
		mu.Unlock()
		return nil
	})
	slices.Sort(rep.Ran)
	if err != nil {
		return rep, fmt.Errorf("shard %s: %w", o.Shard, err)
	}
	return rep, nil
}

// JobFileName is the result file of job j, under JobsDir.
func JobFileName(j int) string { return fmt.Sprintf("job-%06d.gob", j) }

// jobFileRe matches the names JobFileName makes.
var jobFileRe = regexp.MustCompile(`^job-([0-9]{6,})\.gob$`)

// jobFileNames lists the job result files in dir/jobs by name.
func jobFileNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(dir, JobsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, JobsDir), err)
	}
	var out []string
	for _, e := range entries {
		if jobFileRe.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// jobFile is a job's result file: a gob of this struct. The point is JSON
// (the encoding results.json is written from, so it reads back exactly:
// empty maps stay {}, which gob would drop), its records gob.
type jobFile struct {
	Format   int
	Version  string
	PlanHash string
	Index    int
	// Shard is the shard that ran the job, i/N: what Merge names when jobs
	// are missing.
	Shard string
	// Point is the job's Point without its records, as JSON.
	Point []byte
	// HasRecords tells no records (nil) from none kept.
	HasRecords bool
	Records    []results.Record
}

// writeJobFile stores job j's point. The same job of the same plan gives
// the same bytes.
func writeJobFile(dir string, p *Plan, j int, s Shard, pt Point) error {
	head := pt
	head.Records = nil
	pj, err := json.Marshal(head)
	if err != nil {
		return fmt.Errorf("job %d: encode its point: %w", j, err)
	}
	jf := jobFile{Format: PlanFormat, Version: p.file.Version, PlanHash: p.hash, Index: j, Shard: s.String(),
		Point: pj, HasRecords: pt.Records != nil, Records: pt.Records}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&jf); err != nil {
		return fmt.Errorf("job %d: encode its result: %w", j, err)
	}
	return writeFileAtomic(filepath.Join(dir, JobsDir, JobFileName(j)), buf.Bytes())
}

// readJobFile reads job j's point and checks it belongs to plan p; the
// error names the file (relative to dir) and wraps fs.ErrNotExist when
// there is none.
func readJobFile(dir string, p *Plan, j int) (jobFile, error) {
	name := filepath.Join(JobsDir, JobFileName(j))
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return jobFile{}, fmt.Errorf("%s: %w", name, err)
	}
	jf, err := decodeJobFile(data)
	if err != nil {
		return jobFile{}, fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case jf.PlanHash != p.hash:
		return jobFile{}, fmt.Errorf("%s: a result of another plan (%.12s; this plan is %.12s)", name, jf.PlanHash, p.hash)
	case jf.Version != p.file.Version:
		return jobFile{}, fmt.Errorf("%s: made by inferrail %s, the plan by %s", name, jf.Version, p.file.Version)
	case jf.Index != j:
		return jobFile{}, fmt.Errorf("%s: holds job %d, not %d", name, jf.Index, j)
	}
	return jf, nil
}

// decodeJobFile reads a job file's bytes and checks their format.
func decodeJobFile(data []byte) (jobFile, error) {
	var jf jobFile
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&jf); err != nil {
		return jobFile{}, fmt.Errorf("not a job result: %w", err)
	}
	if jf.Format != PlanFormat {
		return jobFile{}, fmt.Errorf("format %d, this build reads format %d", jf.Format, PlanFormat)
	}
	if jf.Index < 0 {
		return jobFile{}, fmt.Errorf("job index %d is negative", jf.Index)
	}
	if _, err := jf.point(); err != nil {
		return jobFile{}, err
	}
	return jf, nil
}

// point is the job's Point, records included.
func (jf *jobFile) point() (Point, error) {
	var pt Point
	if err := decodeStrict(jf.Point, &pt); err != nil {
		return Point{}, fmt.Errorf("its point: %w", err)
	}
	if pt.Records != nil {
		return Point{}, errors.New("its point: records belong in Records")
	}
	pt.Records = jf.Records
	if jf.HasRecords && pt.Records == nil {
		pt.Records = []results.Record{}
	}
	return pt, nil
}
