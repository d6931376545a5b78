package compare

// Sweeps past one machine, with no coordinator: a plan, shards, a merge.
//
// NewPlan expands a Spec into its jobs, in Run's order, and WritePlan stores
// them in DIR/plan.json with everything Write needs. RunShard (sweep_run.go)
// runs the jobs of one shard, those whose index j has j % N == i, and stores
// each job's point in DIR/jobs/, one file per job written by rename, so that
// a shard killed half-way and started again skips what it finished. Merge
// (sweep_merge.go) checks that every job is there, from this plan and this
// build, and writes what Write writes for the unsharded Run, byte for byte.
// A shard is a pure function of the plan and its index: any batch system
// (xargs -P, a Slurm array, a Kubernetes Indexed Job) can run the shards.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// The files of a sweep directory.
const (
	// PlanFile is the plan in a sweep directory.
	PlanFile = "plan.json"
	// JobsDir holds one result file per finished job (JobFileName).
	JobsDir = "jobs"
	// PlanFormat is the version of plan.json and of the job files that this
	// build reads and writes; a plan of another format is refused.
	PlanFormat = 1
)

// Plan is a comparison split into jobs that any machine can run (RunShard)
// and that Merge turns into Write's outputs. Its hash is the SHA-256 of
// plan.json: every job file names the plan it belongs to.
type Plan struct {
	file planFile
	data []byte // plan.json
	hash string
}

// planFile is plan.json.
type planFile struct {
	Format int `json:"format"`
	// Version is the build that planned (Meta.Version): shards and merge
	// refuse to run on another.
	Version string `json:"version"`
	// Title and Command are the report's (Meta).
	Title   string   `json:"title"`
	Command string   `json:"command"`
	Spec    planSpec `json:"spec"`
	// Replay describes the trace a replay reads, nil for a synthetic
	// workload.
	Replay *Replay   `json:"replay"`
	Jobs   []planJob `json:"jobs"`
}

// planSpec is the Spec of a plan: every field but the ones that do not
// change the results (Parallel, Progress). Empty lists stay empty and nil
// ones null, so the spec reads back as it was.
type planSpec struct {
	Base        storedConfig        `json:"base"`
	Policies    []string            `json:"policies"`
	Admissions  []gateway.Admission `json:"admissions"`
	Ledgers     []string            `json:"ledgers"`
	Limits      []string            `json:"limits"`
	Pools       []Pool              `json:"pools"`
	Isolate     string              `json:"isolate"`
	Seeds       []uint64            `json:"seeds"`
	Rates       []float64           `json:"rates"`
	KeepRecords bool                `json:"keep_records"`
}

// planJob is one simulation of a plan, fully described: its variant, seed,
// rate and fleet size, and the fleet configuration it runs.
type planJob struct {
	Index     int               `json:"index"`
	Label     string            `json:"label"`
	Policy    string            `json:"policy"`
	Admission gateway.Admission `json:"admission"`
	Ledger    string            `json:"ledger"`
	Limits    string            `json:"limits"`
	Without   string            `json:"without"`
	Pool      Pool              `json:"pool"`
	Seed      uint64            `json:"seed"`
	Rate      float64           `json:"rate_rps"`
	Replicas  int               `json:"replicas"`
	Config    storedConfig      `json:"config"`
}

// job is the simulation a planned job describes.
func (pj *planJob) job() job {
	return job{Variant: Variant{Policy: pj.Policy, Admission: pj.Admission, Ledger: pj.Ledger, Limits: pj.Limits, Pool: pj.Pool, Without: pj.Without, Label: pj.Label},
		seed: pj.Seed, rate: pj.Rate, replicas: pj.Replicas}
}

// String names the job in messages.
func (pj *planJob) String() string {
	j := pj.job()
	return fmt.Sprintf("job %d (%s, seed %d, %.3g req/s, %s)", pj.Index, pj.Label, pj.Seed, pj.Rate, j.fleet())
}

// NewPlan expands a comparison into its jobs, in Run's order. meta is the
// report's; meta.Version names the build that plans, and RunShard and Merge
// refuse any other. A trace replay (s.Base.Source) needs replay, which
// describes it (a function cannot be stored); a synthetic workload needs
// none. The plan is checked to read back exactly as given.
func NewPlan(s Spec, meta Meta, replay *Replay) (*Plan, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	switch {
	case meta.Version == "":
		return nil, errors.New("plan: meta.Version must name the build that plans (shards and merge check it)")
	case s.Base.Source != nil && replay == nil:
		return nil, errors.New("plan: a trace replay needs its Replay (the source function cannot be stored in plan.json)")
	case s.Base.Source == nil && replay != nil:
		return nil, errors.New("plan: a Replay needs a trace replay (Base.Source), not a synthetic workload")
	}
	if err := noHooks(s.Base); err != nil {
		return nil, err
	}
	base := s.Base
	base.Source, base.Progress = nil, nil
	pf := planFile{
		Format: PlanFormat, Version: meta.Version, Title: meta.Title, Command: meta.Command,
		Spec: planSpec{Base: storedConfig(base), Policies: s.Policies, Admissions: s.Admissions, Ledgers: s.Ledgers, Limits: s.Limits,
			Pools: s.Pools, Isolate: s.Isolate, Seeds: s.Seeds, Rates: s.Rates, KeepRecords: s.KeepRecords},
		Replay: replay,
	}
	for i, j := range s.jobs() {
		pf.Jobs = append(pf.Jobs, planJob{Index: i, Label: j.Label, Policy: j.Policy, Admission: j.Admission, Ledger: j.Ledger, Limits: j.Limits,
			Pool: j.Pool, Without: j.Without, Seed: j.seed, Rate: j.rate, Replicas: j.replicas, Config: storedConfig(j.config(base))})
	}
	var buf bytes.Buffer
	if err := results.WriteJSON(&buf, pf); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	p, err := parsePlan(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("plan: plan.json does not read back: %w", err)
	}
	if err := sameConfig(fleet.Config(pf.Spec.Base), fleet.Config(p.file.Spec.Base)); err != nil {
		return nil, fmt.Errorf("plan: the base configuration does not survive plan.json: %w", err)
	}
	if !reflect.DeepEqual(pf, p.file) {
		return nil, errors.New("plan: the comparison does not survive plan.json (a spec or job field does not round-trip through JSON)")
	}
	return p, nil
}

// Len is the number of jobs.
func (p *Plan) Len() int { return len(p.file.Jobs) }

// Hash is the SHA-256 of plan.json, in hex.
func (p *Plan) Hash() string { return p.hash }

// Version names the build that made the plan.
func (p *Plan) Version() string { return p.file.Version }

// Spec is the comparison the plan runs (without Parallel and Progress,
// which do not change its results); a trace replay's source reads
// Replay's trace.
func (p *Plan) Spec() Spec {
	ps := p.file.Spec
	base := fleet.Config(ps.Base)
	if p.file.Replay != nil {
		base.Source = p.file.Replay.Source()
	}
	return Spec{Base: base, Policies: ps.Policies, Admissions: ps.Admissions, Ledgers: ps.Ledgers, Limits: ps.Limits,
		Pools: ps.Pools, Isolate: ps.Isolate, Seeds: ps.Seeds, Rates: ps.Rates, KeepRecords: ps.KeepRecords}
}

// Meta is the report's title, version and command.
func (p *Plan) Meta() Meta {
	return Meta{Title: p.file.Title, Version: p.file.Version, Command: p.file.Command}
}

// checkVersion refuses a build other than the plan's: another build may
// simulate (or render) differently, and the merged outputs would not be
// those of one run.
func (p *Plan) checkVersion(version string) error {
	if version != p.file.Version {
		return fmt.Errorf("the plan was made by inferrail %s, this is %s: run plan, every shard and merge with the same build (or plan again with this one)",
			p.file.Version, version)
	}
	return nil
}

// WritePlan stores p in dir/plan.json (by rename: a reader sees the old
// plan or the new, whole). Writing the plan a directory already holds
// changes nothing, so finished jobs stay valid; a different plan is
// refused while results of the old one are in dir/jobs.
func WritePlan(dir string, p *Plan) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, PlanFile)
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, p.data):
		return nil
	case err == nil:
		names, err := jobFileNames(dir)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("%s holds another plan, with %d job results in %s: plan into a new directory, or remove %s to start over",
				dir, len(names), filepath.Join(dir, JobsDir), filepath.Join(dir, JobsDir))
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read %s: %w", path, err)
	}
	return writeFileAtomic(path, p.data)
}

// LoadPlan reads dir/plan.json.
func LoadPlan(dir string) (*Plan, error) {
	path := filepath.Join(dir, PlanFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s has no %s (make one with inferrail compare plan --out %s): %w", dir, PlanFile, dir, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	p, err := parsePlan(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// parsePlan reads plan.json strictly: its format first, then every field
// (an unknown one is an error), then the jobs' order.
func parsePlan(data []byte) (*Plan, error) {
	var pf planFile
	err := decodeStrict(data, &pf)
	if err != nil || pf.Format != PlanFormat {
		// Another format may not decode as this one: say which it is.
		var head struct {
			Format int `json:"format"`
		}
		if json.Unmarshal(data, &head) == nil && head.Format != PlanFormat {
			return nil, fmt.Errorf("format %d, this build reads format %d: plan again with this build", head.Format, PlanFormat)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("not a plan: %w", err)
	}
	if len(pf.Jobs) == 0 {
		return nil, errors.New("the plan has no jobs")
	}
	for i, j := range pf.Jobs {
		if j.Index != i {
			return nil, fmt.Errorf("jobs: the job at position %d has index %d (jobs are listed in index order from 0)", i, j.Index)
		}
	}
	if pf.Version == "" {
		return nil, errors.New("version: the plan does not name the build that made it")
	}
	sum := sha256.Sum256(data)
	return &Plan{file: pf, data: slices.Clone(data), hash: hex.EncodeToString(sum[:])}, nil
}

// decodeStrict decodes one JSON value, refusing unknown fields and
// anything after the value.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

// storedConfig is a fleet.Config as plan.json stores it: every field but
// the functions (Source, which the plan's Replay describes, and the hooks
// Trace and Progress), under fleet.Config's Go names. The fields are read
// from fleet.Config itself, so a field added there is stored too.
type storedConfig fleet.Config

// configType is configFields, computed once.
var configType = sync.OnceValues(configFields)

// configFields is fleet.Config without its functions, as a struct type of
// the same field names, types and tags.
func configFields() (reflect.Type, error) {
	t := reflect.TypeFor[fleet.Config]()
	var fs []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Func {
			continue
		}
		if !f.IsExported() {
			return nil, fmt.Errorf("fleet.Config.%s is unexported: plan.json cannot store it", f.Name)
		}
		fs = append(fs, reflect.StructField{Name: f.Name, Type: f.Type, Tag: f.Tag, Anonymous: f.Anonymous})
	}
	return reflect.StructOf(fs), nil
}

// MarshalJSON implements json.Marshaler.
func (c storedConfig) MarshalJSON() ([]byte, error) {
	t, err := configType()
	if err != nil {
		return nil, err
	}
	src := reflect.ValueOf(fleet.Config(c))
	v := reflect.New(t).Elem()
	for i := range t.NumField() {
		v.Field(i).Set(src.FieldByName(t.Field(i).Name))
	}
	return json.Marshal(v.Interface())
}

// UnmarshalJSON implements json.Unmarshaler, strictly: an unknown field is
// an error.
func (c *storedConfig) UnmarshalJSON(b []byte) error {
	t, err := configType()
	if err != nil {
		return err
	}
	v := reflect.New(t)
	if err := decodeStrict(b, v.Interface()); err != nil {
		return fmt.Errorf("fleet configuration: %w", err)
	}
	var out fleet.Config
	dst := reflect.ValueOf(&out).Elem()
	for i := range t.NumField() {
		dst.FieldByName(t.Field(i).Name).Set(v.Elem().Field(i))
	}
	*c = storedConfig(out)
	return nil
}

// noHooks refuses a base configuration with a function set, but Source
// (which a Replay describes) and Progress (which shards set their own): a
// hook of one process cannot be stored in plan.json.
func noHooks(c fleet.Config) error {
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type.Kind() == reflect.Func && !v.Field(i).IsNil() && f.Name != "Source" && f.Name != "Progress" {
			return fmt.Errorf("plan: Base.%s is set, a hook of one process, which plan.json cannot store", f.Name)
		}
	}
	return nil
}

// sameConfig names the first field of fleet.Config (functions aside) that
// differs between a and b.
func sameConfig(a, b fleet.Config) error {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		if t.Field(i).Type.Kind() == reflect.Func {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return fmt.Errorf("field %s reads back as %+v, was %+v", t.Field(i).Name, vb.Field(i).Interface(), va.Field(i).Interface())
		}
	}
	return nil
}

// Replay describes a comparison's trace replay (fleet.Config.Source) so
// that a plan can store it and every shard open it again: the trace's path
// as given (every shard must see the same trace there, relative to its
// working directory), its format, whether malformed records are skipped,
// the replay options but the seed (each run's own), and the SHA-256 of the
// trace, which RunShard checks before it runs.
type Replay struct {
	Path    string               `json:"path"`
	Format  string               `json:"format"`
	SkipBad bool                 `json:"skip_bad"`
	Options traces.ReplayOptions `json:"options"`
	SHA256  string               `json:"sha256"`
}

// NewReplay describes the replay of the trace at path (a file, or a vLLM
// log directory) in format (traces.Formats) with opts, and hashes it.
func NewReplay(path, format string, skipBad bool, opts traces.ReplayOptions) (*Replay, error) {
	if format == "" {
		return nil, errors.New("replay: format: name the trace's format (traces.Detect finds it)")
	}
	if !slices.Contains(traces.Formats(), format) {
		return nil, fmt.Errorf("replay: format: must be one of %s, got %q", strings.Join(traces.Formats(), ", "), format)
	}
	opts.Seed = 0
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	sum, err := digestPath(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return &Replay{Path: path, Format: format, SkipBad: skipBad, Options: opts, SHA256: sum}, nil
}

// Source opens a fresh replay of the trace for each run, seeded with the
// run's seed (what fleet.Config.Source wants).
func (r *Replay) Source() func(seed uint64) (workload.Source, error) {
	path, format, skip, opts := r.Path, r.Format, r.SkipBad, r.Options
	return func(seed uint64) (workload.Source, error) {
		rd, c, err := traces.Open(path, format, traces.Options{SkipBad: skip})
		if err != nil {
			return nil, err
		}
		o := opts
		o.Seed = seed
		src, err := traces.NewSource(rd, o)
		if err != nil {
			c.Close()
			return nil, err
		}
		src.CloseAtEnd(c)
		return src, nil
	}
}

// check refuses a trace that is not the one planned.
func (r *Replay) check() error {
	sum, err := digestPath(r.Path)
	if err != nil {
		return fmt.Errorf("the plan's trace: %w", err)
	}
	if sum != r.SHA256 {
		return fmt.Errorf("the plan's trace %s has changed since the plan (sha256 %.12s, planned %.12s): every shard must read the planned trace",
			r.Path, sum, r.SHA256)
	}
	return nil
}

// digestPath is the SHA-256 of a file, or of a directory's regular files
// (a vLLM log directory): their names and contents, in name order.
func digestPath(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	hashFile := func(p string) error {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	}
	if !st.IsDir() {
		if err := hashFile(path); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	entries, err := os.ReadDir(path) // sorted by name
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fmt.Fprintf(h, "%s\x00", e.Name())
		if err := hashFile(filepath.Join(path, e.Name())); err != nil {
			return "", err
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory (a dot file, which Merge ignores), synced and renamed: a
// reader, or a shard killed mid-write, sees the whole file or none.
func writeFileAtomic(path string, data []byte) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
