package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestRun builds an image the way "make image" does, from a small static
// binary, with SOURCE_DATE_EPOCH, and reads its creation time back.
func TestRun(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "inferrail-static")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}

	t.Setenv("SOURCE_DATE_EPOCH", "1764504000") // 2025-11-30T12:00:00Z
	out := filepath.Join(dir, "image.tar")
	var stdout, stderr strings.Builder
	err = run([]string{"-binary", bin, "-version", "1.2.3", "-revision", "abc123", "-out", out, "-ca-certs", ""}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v (stderr %q)", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "inferrail:1.2.3") || !strings.Contains(stdout.String(), "podman load -i "+out) {
		t.Errorf("output %q does not name the tag and how to load it", stdout.String())
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.Config.Labels["org.opencontainers.image.created"]; got != "2025-11-30T12:00:00Z" {
		t.Errorf("created label %q, want SOURCE_DATE_EPOCH's 2025-11-30T12:00:00Z", got)
	}
	if got := cf.Config.Labels["org.opencontainers.image.revision"]; got != "abc123" {
		t.Errorf("revision label %q", got)
	}
	if slices.Contains(cf.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Error(`-ca-certs "" still put a CA bundle in`)
	}

	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"-version", "1", "-out", out}, "1", "-binary is required"},
		{[]string{"-binary", bin, "-out", out}, "1", "-version is required"},
		{[]string{"-binary", bin, "-version", "1"}, "1", "-out is required"},
		{[]string{"-binary", bin, "-version", "1", "-revision", "r", "-out", out}, "yesterday", "SOURCE_DATE_EPOCH"},
		{[]string{"-binary", bin, "-version", "a b", "-out", out}, "1", "not a valid image tag"},
	} {
		t.Setenv("SOURCE_DATE_EPOCH", c.env)
		err := run(c.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
