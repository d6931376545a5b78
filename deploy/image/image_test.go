package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/inferrail/inferrail/live/config"
)

// tinyMain is the program the tests put in the image: a real static Go
// binary that builds in about a second (./cmd/inferrail takes about a
// minute statically on these machines).
const tinyMain = `package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("tiny inferrail %v\n", os.Args[1:])
}
`

// buildTiny builds tinyMain in a new directory under dir with the given
// CGO_ENABLED and flags, and returns the binary's path.
func buildTiny(t *testing.T, dir, cgo string, flags ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build a test binary: %v", err)
	}
	dir, err = os.MkdirTemp(dir, "tiny-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(tinyMain), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "inferrail-static")
	cmd := exec.Command(goBin, append(append([]string{"build"}, flags...), "-o", out, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOOS=linux", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// shared holds what every test may use: the good binary is built once.
var shared struct {
	dir, binary string
}

func goodBinary(t *testing.T) string {
	t.Helper()
	if shared.binary == "" {
		shared.binary = buildTiny(t, shared.dir, "0", "-trimpath")
	}
	return shared.binary
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "inferrail-image-test-")
	if err != nil {
		panic(err)
	}
	shared.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// created is the fixed creation time of the test images.
var created = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// testCerts is a CA bundle with one (syntactically PEM) certificate; its
// contents only need to reach the image byte for byte.
var testCerts = []byte("-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n")

func options(t *testing.T, bin string) Options {
	t.Helper()
	certs := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(certs, testCerts, 0o644); err != nil {
		t.Fatal(err)
	}
	return Options{Binary: bin, Version: "0.1.0", Revision: "0123456789abcdef0123456789abcdef01234567", Created: created, CACerts: certs}
}

// build builds the image of o and writes it to dir/name, returning the path.
func build(t *testing.T, o Options, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	if _, _, err := Build(out, o); err != nil {
		t.Fatalf("Build: %v", err)
	}
	return out
}

// entry is one file of a layer as read back.
type entry struct {
	hdr  *tar.Header
	data []byte
}

// readLayers reads every layer of img, the later layers' entries
// replacing the earlier ones'.
func readLayers(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Errorf("%d layers, want 2 (base files, binary)", len(layers))
	}
	files := map[string]entry{}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(h.Name, "/") || strings.HasPrefix(h.Name, "./") || strings.Contains(h.Name, "..") {
				t.Errorf("layer %d: entry name %q is not a clean relative path", i, h.Name)
			}
			files[h.Name] = entry{h, b}
		}
		rc.Close()
	}
	return files
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("live/config default address %q: %v", addr, err)
	}
	return p
}

// TestImage builds an image, reads it back from the tarball and checks its
// configuration and files.
func TestImage(t *testing.T) {
	bin := goodBinary(t)
	o := options(t, bin)
	out := build(t, o, t.TempDir(), "image.tar")

	tag, _ := Tag(o.Version)
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("read back %s: %v", out, err)
	}
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || !slices.Equal(manifest[0].RepoTags, []string{"inferrail:0.1.0"}) {
		t.Errorf("manifest.json: %+v, want one image tagged inferrail:0.1.0", manifest)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532", c.User)
	}
	if uid, _, _ := strings.Cut(c.User, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("User %q runs as root", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/inferrail"}) {
		t.Errorf("Entrypoint %q", c.Entrypoint)
	}
	if !slices.Equal(c.Cmd, []string{"live", "--config", "/etc/inferrail/live.yaml"}) {
		t.Errorf("Cmd %q", c.Cmd)
	}
	def := config.Default()
	wantPorts := []string{portOf(t, def.Listen) + "/tcp", portOf(t, def.AdminListen) + "/tcp"}
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	slices.Sort(wantPorts)
	if !slices.Equal(ports, wantPorts) {
		t.Errorf("ExposedPorts %v, want %v (live/config's default listen and admin_listen)", ports, wantPorts)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "inferrail",
		"org.opencontainers.image.version":  "0.1.0",
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.source":   DefaultSource,
		"org.opencontainers.image.licenses": "MIT",
		"org.opencontainers.image.created":  "2026-11-30T12:00:00Z",
	}
	for k, v := range wantLabels {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if c.Labels["org.opencontainers.image.description"] == "" {
		t.Error("no description label")
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !cf.Created.Time.Equal(created) {
		t.Errorf("created %v, want %v", cf.Created.Time, created)
	}
	if !slices.Contains(c.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("Env %q lacks SSL_CERT_FILE", c.Env)
	}

	files := readLayers(t, img)
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	b, ok := files["usr/local/bin/inferrail"]
	switch {
	case !ok:
		t.Fatalf("no usr/local/bin/inferrail in the layers; have %v", keys(files))
	case b.hdr.Typeflag != tar.TypeReg || fs.FileMode(b.hdr.Mode).Perm() != 0o755:
		t.Errorf("binary: type %c mode %o, want a regular file 0755", b.hdr.Typeflag, b.hdr.Mode)
	case b.hdr.Uid != 0 || b.hdr.Gid != 0:
		t.Errorf("binary owned by %d:%d, want root (not writable by the user it runs as)", b.hdr.Uid, b.hdr.Gid)
	case !bytes.Equal(b.data, want):
		t.Errorf("binary in the image (%d bytes) differs from the input (%d bytes)", len(b.data), len(want))
	}

	// The binary in the image is static (read with debug/elf here, apart
	// from CheckStatic) and runs.
	extracted := filepath.Join(t.TempDir(), "inferrail")
	if err := os.WriteFile(extracted, b.data, 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(extracted)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary in the image has a PT_INTERP program header: dynamically linked")
		}
	}
	if libs, err := ef.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary in the image needs shared libraries %v (%v)", libs, err)
	}
	ef.Close()
	if runtime.GOOS == "linux" {
		got, err := exec.Command(extracted, "live", "--config", "x").Output()
		if err != nil || string(got) != "tiny inferrail [live --config x]\n" {
			t.Errorf("running the extracted binary: %q, %v", got, err)
		}
	}

	if e := files["etc/passwd"]; !strings.Contains(string(e.data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks nonroot 65532: %q", e.data)
	}
	if e := files["etc/group"]; !strings.Contains(string(e.data), "nonroot:x:65532:") {
		t.Errorf("/etc/group lacks nonroot 65532: %q", e.data)
	}
	if e, ok := files["tmp/"]; !ok || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode&0o7777 != 0o1777 {
		t.Errorf("/tmp: %+v, want a directory 1777", e.hdr)
	}
	if e := files["etc/ssl/certs/ca-certificates.crt"]; !bytes.Equal(e.data, testCerts) {
		t.Errorf("CA bundle %q, want the input's", e.data)
	}
	for n, e := range files {
		if !e.hdr.ModTime.Equal(created) {
			t.Errorf("%s: time %v, want the creation time %v", n, e.hdr.ModTime, created)
		}
	}
}

func keys(m map[string]entry) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func digestOf(t *testing.T, p string) v1.Hash {
	t.Helper()
	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReproducible: the same binary and options give the same tarball and
// digest, wherever the binary lies and whatever its file time; another
// version gives another digest.
func TestReproducible(t *testing.T) {
	bin := goodBinary(t)
	dir := t.TempDir()
	o := options(t, bin)
	first := build(t, o, dir, "a.tar")

	moved := filepath.Join(t.TempDir(), "elsewhere")
	if err := copyFile(bin, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(moved, time.Now().Add(time.Hour), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	o2 := o
	o2.Binary = moved
	second := build(t, o2, dir, "b.tar")

	if a, b := fileSum(t, first), fileSum(t, second); a != b {
		t.Errorf("two builds of the same inputs differ: tarballs %s and %s", a, b)
	}
	if a, b := digestOf(t, first), digestOf(t, second); a != b {
		t.Errorf("two builds of the same inputs differ: digests %s and %s", a, b)
	}

	o3 := o
	o3.Version = "0.1.1"
	third := build(t, o3, dir, "c.tar")
	if digestOf(t, first) == digestOf(t, third) {
		t.Error("another version gave the same digest")
	}
}

// TestBadInput: each bad input is refused with an error that says what is
// wrong, and no tarball is left behind.
func TestBadInput(t *testing.T) {
	good := goodBinary(t)
	dir := t.TempDir()
	text := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(text, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		mod  func(*Options)
		want []string
	}{
		{"missing binary", func(o *Options) { o.Binary = filepath.Join(dir, "nope") }, []string{"binary", "no such file"}},
		{"no binary", func(o *Options) { o.Binary = "" }, []string{"binary", "required"}},
		{"not ELF", func(o *Options) { o.Binary = text }, []string{"not a Linux ELF executable"}},
		{"no trimpath", func(o *Options) { o.Binary = buildTiny(t, t.TempDir(), "0") }, []string{"-trimpath"}},
		{"bad version", func(o *Options) { o.Version = "1.0/beta" }, []string{"not a valid image tag"}},
		{"latest", func(o *Options) { o.Version = "latest" }, []string{`"latest" is not allowed`}},
		{"no revision", func(o *Options) { o.Revision = "" }, []string{"revision", "required"}},
		{"no time", func(o *Options) { o.Created = time.Time{} }, []string{"SOURCE_DATE_EPOCH"}},
		{"missing certs", func(o *Options) { o.CACerts = filepath.Join(dir, "none.crt") }, []string{"ca certs", "no such file"}},
		{"certs not PEM", func(o *Options) { o.CACerts = text }, []string{"no PEM certificate"}},
	}
	// A dynamically linked binary: the host's own programs are.
	for _, p := range []string{"/bin/ls", "/usr/bin/ls", "/bin/sh", "/usr/bin/env"} {
		if f, err := elf.Open(p); err == nil {
			dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
			f.Close()
			if dynamic {
				cases = append(cases, struct {
					name string
					mod  func(*Options)
					want []string
				}{"dynamic " + p, func(o *Options) { o.Binary = p }, []string{"dynamically linked", "CGO_ENABLED=0"}})
				break
			}
		}
	}
	if len(cases) < 11 {
		t.Error("no dynamically linked ELF binary found on this host to test with")
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := options(t, good)
			c.mod(&o)
			out := filepath.Join(t.TempDir(), "image.tar")
			_, _, err := Build(out, o)
			if err == nil {
				t.Fatal("Build accepted it")
			}
			if _, serr := os.Stat(out); serr == nil {
				t.Error("a refused build left a tarball")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if err.Error() != strings.ToLower(err.Error()[:1])+err.Error()[1:] {
				t.Errorf("error %q does not start in lower case", err)
			}
		})
	}

	// A write that fails leaves nothing at the path.
	img, _, err := New(options(t, good))
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := Tag("0.1.0")
	if err := WriteTarball(img, tag, filepath.Join(dir, "no-such-dir", "x.tar")); err == nil {
		t.Error("WriteTarball into a missing directory succeeded")
	}
}

// TestLayout writes an OCI layout too and finds the same image in it.
func TestLayout(t *testing.T) {
	o := options(t, goodBinary(t))
	img, _, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := Tag(o.Version)
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(img, tag, dir); err != nil {
		t.Fatal(err)
	}
	idx, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(idx), d.String()) || !strings.Contains(string(idx), strconv.Quote("0.1.0")) {
		t.Errorf("index.json %s lacks the image %s tagged 0.1.0", idx, d)
	}
}

// TestSkopeo reads the tarball with skopeo (containers/image, the library
// podman load uses) where it is installed: an independent reader agrees
// on the tag, the platform and the configuration.
func TestSkopeo(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		t.Skip("skopeo not installed (Debian: apt-get install skopeo)")
	}
	o := options(t, goodBinary(t))
	out := build(t, o, t.TempDir(), "image.tar")
	tags, err := exec.Command(skopeo, "list-tags", "docker-archive:"+out).Output()
	if err != nil {
		t.Fatalf("skopeo list-tags: %v", err)
	}
	if !strings.Contains(string(tags), `"inferrail:0.1.0"`) {
		t.Errorf("skopeo finds tags %s, want inferrail:0.1.0", tags)
	}
	b, err := exec.Command(skopeo, "inspect", "--config", "docker-archive:"+out+":inferrail:0.1.0").Output()
	if err != nil {
		t.Fatalf("skopeo inspect: %v", err)
	}
	var cf v1.ConfigFile
	if err := json.Unmarshal(b, &cf); err != nil {
		t.Fatalf("skopeo's config: %v\n%s", err, b)
	}
	if cf.Config.User != User || !slices.Equal(cf.Config.Entrypoint, Entrypoint) || cf.Architecture != runtime.GOARCH || cf.OS != "linux" || len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("skopeo reads user %q entrypoint %q platform %s/%s, %d layers", cf.Config.User, cf.Config.Entrypoint, cf.OS, cf.Architecture, len(cf.RootFS.DiffIDs))
	}
}
