package compare

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MergeOptions say where Merge writes, and which build merges.
type MergeOptions struct {
	// Out is the directory of the outputs; "" is the sweep directory.
	Out string
	// Version names the running build; it must be the plan's.
	Version string
}

// Merged is a merged sweep: what Run and Write give for the unsharded
// comparison.
type Merged struct {
	Spec   Spec
	Points []Point
	// Out is where Files (Write's) were written.
	Out   string
	Files []string
}

// maxListed bounds the jobs an error lists by name.
const maxListed = 10

// Merge checks that dir/jobs holds one valid result of every job of the
// plan in dir (none missing, none of another plan or build, no job the plan
// does not have) and writes Write's outputs for them: results.json,
// requests.parquet, report.md and the charts, the same bytes as Run and
// Write of the unsharded comparison. The error lists every problem: the
// missing jobs and the shards that hold them, and each file that does not
// belong.
func Merge(dir string, o MergeOptions) (*Merged, error) {
	p, err := LoadPlan(dir)
	if err != nil {
		return nil, err
	}
	if err := p.checkVersion(o.Version); err != nil {
		return nil, err
	}
	pts, err := collect(dir, p)
	if err != nil {
		return nil, err
	}
	out := o.Out
	if out == "" {
		out = dir
	}
	s := p.Spec()
	files, err := Write(out, s, pts, nil, p.Meta())
	if err != nil {
		return nil, err
	}
	return &Merged{Spec: s, Points: pts, Out: out, Files: files}, nil
}

// collect reads every job's point, in job order.
func collect(dir string, p *Plan) ([]Point, error) {
	pts := make([]Point, p.Len())
	var (
		missing []int
		errs    []error
	)
	counts := map[int]bool{} // shard counts the results were run with
	for j := range p.Len() {
		jf, err := readJobFile(dir, p, j)
		if errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, j)
			continue
		}
		if err == nil {
			pts[j], err = jf.point()
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if s, err := ParseShard(jf.Shard); err == nil {
			counts[s.Count] = true
		}
	}
	names, err := jobFileNames(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		j, err := strconv.Atoi(jobFileRe.FindStringSubmatch(name)[1])
		switch {
		case err != nil || name != JobFileName(j):
			errs = append(errs, fmt.Errorf("%s: not a name this build writes (job results are named like %s)", filepath.Join(JobsDir, name), JobFileName(0)))
		case j >= p.Len():
			errs = append(errs, fmt.Errorf("%s: job %d is not in this plan of %d jobs", filepath.Join(JobsDir, name), j, p.Len()))
		}
	}
	if len(missing) > 0 {
		errs = append([]error{missingError(dir, p, missing, counts)}, errs...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("merge %s: %w", dir, errors.Join(errs...))
	}
	return pts, nil
}

// missingError names the missing jobs (the first maxListed) and, when every
// result was run with one shard count, the shards to rerun.
func missingError(dir string, p *Plan, missing []int, counts map[int]bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d job results are missing: ", len(missing), p.Len())
	for i, j := range missing[:min(len(missing), maxListed)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.file.Jobs[j].String())
	}
	if len(missing) > maxListed {
		fmt.Fprintf(&b, " and %d more", len(missing)-maxListed)
	}
	switch {
	case len(missing) == p.Len():
		fmt.Fprintf(&b, "; no job has run yet: run every shard, inferrail compare run %s --shard i/N for i from 0 to N-1", dir)
	case len(counts) == 1:
		var n int
		for c := range counts {
			n = c
		}
		var idx []int
		seen := map[int]bool{}
		for _, j := range missing {
			if i := j % n; !seen[i] {
				seen[i] = true
				idx = append(idx, i)
			}
		}
		slices.Sort(idx)
		shards := make([]string, len(idx))
		for k, i := range idx {
			shards[k] = Shard{Index: i, Count: n}.String()
		}
		word := "shard"
		if len(shards) > 1 {
			word = "shards"
		}
		fmt.Fprintf(&b, "; run %s %s again (inferrail compare run %s --shard %s): finished jobs are skipped", word, strings.Join(shards, ", "), dir, shards[0])
	default:
		fmt.Fprintf(&b, "; run the shards that hold them again (inferrail compare run %s --shard i/N): finished jobs are skipped", dir)
	}
	return errors.New(b.String())
}
