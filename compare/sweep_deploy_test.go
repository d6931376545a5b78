package compare

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/yaml"
)

// readJobs decodes the Jobs of a YAML file strictly (unknown fields are
// errors), skipping other kinds.
func readJobs(t *testing.T, path string) []batchv1.Job {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []batchv1.Job
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if head.Kind != "Job" {
			continue
		}
		var j batchv1.Job
		if err := yaml.UnmarshalStrict(doc, &j); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, j)
	}
	return out
}

// argAfter is the argument after flag in args, "" if none.
func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// deploy/sweep's Indexed Job runs one shard per completion index, N of N
// where N is its completions, over the directory its init container plans
// into and merge-job.yaml merges.
func TestIndexedJobRunsEveryShard(t *testing.T) {
	dir := filepath.Join("..", "deploy", "sweep")
	jobs := readJobs(t, filepath.Join(dir, "indexed-job.yaml"))
	if len(jobs) != 1 {
		t.Fatalf("indexed-job.yaml has %d Jobs, want 1", len(jobs))
	}
	j := jobs[0]
	s := j.Spec
	if s.CompletionMode == nil || *s.CompletionMode != batchv1.IndexedCompletion || s.Completions == nil || s.Parallelism == nil || s.BackoffLimitPerIndex == nil {
		t.Fatalf("want completionMode Indexed with completions, parallelism and backoffLimitPerIndex: %+v", s)
	}
	pod := s.Template.Spec
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("want one init container (plan) and one container (the shard): %+v", pod)
	}
	plan, shard := pod.InitContainers[0].Args, pod.Containers[0].Args
	if !slices.Equal(plan[:2], []string{"compare", "plan"}) || !slices.Equal(shard[:2], []string{"compare", "run"}) {
		t.Fatalf("init container %v, container %v", plan, shard)
	}
	sweep := argAfter(plan, "--out")
	if sweep == "" || shard[2] != sweep || !strings.HasPrefix(sweep, pod.Containers[0].VolumeMounts[0].MountPath+"/") {
		t.Fatalf("plan --out %q, shard directory %q, volume at %q", sweep, shard[2], pod.Containers[0].VolumeMounts[0].MountPath)
	}
	env := pod.Containers[0].Env
	if len(env) != 1 || env[0].ValueFrom == nil || env[0].ValueFrom.FieldRef == nil ||
		env[0].ValueFrom.FieldRef.FieldPath != "metadata.annotations['batch.kubernetes.io/job-completion-index']" {
		t.Fatalf("the shard's env must carry the completion index: %+v", env)
	}
	n := int(*s.Completions)
	spec := argAfter(shard, "--shard")
	want := "$(" + env[0].Name + ")/" + strconv.Itoa(n)
	if spec != want {
		t.Fatalf("--shard %q, want %q (one shard per index of %d completions)", spec, want, n)
	}
	for i := range n {
		if _, err := ParseShard(strings.ReplaceAll(spec, "$("+env[0].Name+")", strconv.Itoa(i))); err != nil {
			t.Errorf("index %d: %v", i, err)
		}
	}
	merges := readJobs(t, filepath.Join(dir, "merge-job.yaml"))
	if len(merges) != 1 || !slices.Equal(merges[0].Spec.Template.Spec.Containers[0].Args, []string{"compare", "merge", sweep}) {
		t.Fatalf("merge-job.yaml must merge %s: %+v", sweep, merges)
	}
	claim := func(j batchv1.Job) string { return j.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.ClaimName }
	if claim(merges[0]) != claim(j) {
		t.Errorf("merge mounts claim %q, the shards %q", claim(merges[0]), claim(j))
	}
}
