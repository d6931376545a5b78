// Command build writes inferrail's OCI image as a docker-archive tarball,
// from a static binary, without a container engine and without pulling
// anything (package deploy/image):
//
//	CGO_ENABLED=0 go build -trimpath -o bin/inferrail-static ./cmd/inferrail
//	go run ./deploy/image/build -binary bin/inferrail-static -version 0.1.0 -out bin/inferrail-image.tar
//	podman load -i bin/inferrail-image.tar    # or docker load -i
//
// The creation time (the created label and every file's time) is
// SOURCE_DATE_EPOCH when set, else the commit time of -revision, so the
// same binary and flags give the same image digest.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/inferrail/inferrail/deploy/image"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "image build: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("build", flag.ContinueOnError)
	fl.SetOutput(stderr)
	binary := fl.String("binary", "", "static inferrail binary (CGO_ENABLED=0 go build -trimpath); required")
	version := fl.String("version", "", "image version: the tag inferrail:VERSION and the version label; required")
	revision := fl.String("revision", "", "source revision for the revision label; default: git rev-parse HEAD")
	out := fl.String("out", "", "docker-archive tarball to write (podman load -i / docker load -i); required")
	layoutDir := fl.String("layout", "", "also write an OCI image layout into this directory")
	caCerts := fl.String("ca-certs", image.HostCACerts, `CA bundle copied into the image; "" for none (a missing default is skipped with a note)`)
	source := fl.String("source", image.DefaultSource, "source label")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	switch {
	case *binary == "":
		return errors.New("-binary is required")
	case *version == "":
		return errors.New("-version is required")
	case *out == "":
		return errors.New("-out is required")
	}
	tag, err := image.Tag(*version)
	if err != nil {
		return err
	}
	if *revision == "" {
		r, err := git("rev-parse", "HEAD")
		if err != nil {
			return fmt.Errorf("-revision not given and git cannot tell the commit: %w", err)
		}
		*revision = r
	}
	created, err := creationTime(*revision)
	if err != nil {
		return err
	}
	certs := *caCerts
	if certs == image.HostCACerts {
		if _, err := os.Stat(certs); err != nil {
			fmt.Fprintf(stderr, "note: %s not found: the image has no CA bundle and cannot verify https:// engines\n", certs)
			certs = ""
		}
	}

	img, sum, err := image.Build(*out, image.Options{
		Binary: *binary, Version: *version, Revision: *revision, Created: created,
		CACerts: certs, Source: *source,
	})
	if err != nil {
		return err
	}
	if *layoutDir != "" {
		if err := image.WriteLayout(img, tag, *layoutDir); err != nil {
			return err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s %s/%s, %s, %.1f MB, created %s\nload it with: podman load -i %s (or docker load -i %s)\n",
		*out, tag, sum.OS, sum.Architecture, digest, float64(st.Size())/1e6, created.Format(time.RFC3339), *out, *out)
	return nil
}

// creationTime is SOURCE_DATE_EPOCH when set, else the commit time of rev.
func creationTime(rev string) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	s, err := git("log", "-1", "--format=%ct", rev)
	if err != nil {
		return time.Time{}, fmt.Errorf("set SOURCE_DATE_EPOCH: git cannot tell the commit time of %s: %w", rev, err)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time of %s: %q: %w", rev, s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

func git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, msg)
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(b)), nil
}
