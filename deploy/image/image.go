package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image holds and how it runs.
const (
	// BinaryPath is where the binary goes in the image.
	BinaryPath = "/usr/local/bin/inferrail"
	// CACertsPath is where the CA bundle goes in the image, the first
	// path Go's crypto/x509 reads on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// HostCACerts is the host's CA bundle on Debian and its derivatives.
	HostCACerts = "/etc/ssl/certs/ca-certificates.crt"
	// ConfigPath is the live configuration the default command reads; the
	// Helm chart mounts its ConfigMap there.
	ConfigPath = "/etc/inferrail/live.yaml"
	// UID and GID are the unprivileged user the image runs as (nonroot,
	// as distroless images name it).
	UID = 65532
	GID = 65532
	// User is the image's config.User.
	User = "65532:65532"
	// ClientPort and AdminPort are the ports of live/config's default
	// listen (127.0.0.1:8080) and admin_listen (127.0.0.1:9090).
	ClientPort = 8080
	AdminPort  = 9090
	// DefaultRepository names the image: its tag is DefaultRepository:VERSION.
	DefaultRepository = "inferrail"
	// DefaultSource is the org.opencontainers.image.source label.
	DefaultSource = "https://github.com/inferrail/inferrail"
	// DefaultDescription is the org.opencontainers.image.description label.
	DefaultDescription = "KV-cache-aware router for vLLM: an OpenAI-compatible proxy and a Gateway API endpoint picker"
	// License is the org.opencontainers.image.licenses label.
	License = "MIT"
)

// OCI label keys (image-spec annotations.md).
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelSource      = "org.opencontainers.image.source"
	LabelLicenses    = "org.opencontainers.image.licenses"
	LabelCreated     = "org.opencontainers.image.created"
)

// Entrypoint and Cmd are the image's entrypoint and default arguments.
var (
	Entrypoint = []string{BinaryPath}
	Cmd        = []string{"live", "--config", ConfigPath}
)

// Options describe one image.
type Options struct {
	// Binary is the path of a static Linux inferrail binary built with
	// CGO_ENABLED=0 and -trimpath. Required.
	Binary string
	// Version is the image's version: the version label and the tag.
	// Required; it must be a valid tag (letters, digits, "_", "." and "-",
	// at most 128, not starting with "." or "-"), and not "latest".
	Version string
	// Revision is the source revision (a commit id), the revision label.
	// Required.
	Revision string
	// Created is the image's creation time, its created label and the
	// time of every file in it; pass SOURCE_DATE_EPOCH or the commit time
	// so the build is reproducible. Required (not the zero time).
	Created time.Time
	// CACerts is the path of a PEM CA bundle to copy to CACertsPath; ""
	// leaves it out (the gateway then cannot verify https:// engines).
	CACerts string
	// Source and Description are the source and description labels;
	// "" means DefaultSource and DefaultDescription.
	Source      string
	Description string
}

// Summary says what New built.
type Summary struct {
	// OS and Architecture are the binary's platform, such as linux and
	// amd64.
	OS, Architecture string
	// BinarySize is the binary's size in bytes.
	BinarySize int64
	// CACerts reports whether a CA bundle is in the image.
	CACerts bool
}

// tagRE is the grammar of an image tag (distribution/reference).
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Tag returns DefaultRepository:version, checking that version is a valid
// tag other than "latest".
func Tag(version string) (name.Tag, error) {
	if !tagRE.MatchString(version) {
		return name.Tag{}, fmt.Errorf("version %q is not a valid image tag: want 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'", version)
	}
	if version == "latest" {
		return name.Tag{}, errors.New(`version "latest" is not allowed: tag the image with a version the chart can pin`)
	}
	t, err := name.NewTag(DefaultRepository + ":" + version)
	if err != nil {
		return name.Tag{}, fmt.Errorf("tag %s:%s: %w", DefaultRepository, version, err)
	}
	return t, nil
}

// New builds the image o describes. It checks that the binary is a static
// Linux Go executable built with -trimpath and takes the image's platform
// from it.
func New(o Options) (v1.Image, Summary, error) {
	var sum Summary
	if o.Binary == "" {
		return nil, sum, errors.New("binary: a path to a static inferrail binary is required")
	}
	if _, err := Tag(o.Version); err != nil {
		return nil, sum, err
	}
	if strings.TrimSpace(o.Revision) == "" {
		return nil, sum, errors.New("revision: the source revision (a commit id) is required for the revision label")
	}
	if o.Created.IsZero() {
		return nil, sum, errors.New("created: a creation time is required (SOURCE_DATE_EPOCH or the commit time), so the build is reproducible")
	}
	created := o.Created.UTC().Truncate(time.Second)
	if created.Before(time.Unix(0, 0)) {
		return nil, sum, fmt.Errorf("created: %v is before 1970", created)
	}

	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, sum, fmt.Errorf("binary: %w", err)
	}
	arch, err := CheckStatic(o.Binary)
	if err != nil {
		return nil, sum, err
	}
	sum.OS, sum.Architecture, sum.BinarySize = "linux", arch, int64(len(bin))

	var certs []byte
	if o.CACerts != "" {
		certs, err = os.ReadFile(o.CACerts)
		if err != nil {
			return nil, sum, fmt.Errorf("ca certs: %w", err)
		}
		if !bytes.Contains(certs, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, sum, fmt.Errorf("ca certs: %s holds no PEM certificate", o.CACerts)
		}
		sum.CACerts = true
	}

	base, err := layer(baseFiles(certs), created)
	if err != nil {
		return nil, sum, fmt.Errorf("base layer: %w", err)
	}
	binLayer, err := layer(binaryFiles(bin), created)
	if err != nil {
		return nil, sum, fmt.Errorf("binary layer: %w", err)
	}

	source, desc := o.Source, o.Description
	if source == "" {
		source = DefaultSource
	}
	if desc == "" {
		desc = DefaultDescription
	}
	env := []string{"PATH=/usr/local/bin"}
	if sum.CACerts {
		env = append(env, "SSL_CERT_FILE="+CACertsPath)
	}
	cf := &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			User:       User,
			Entrypoint: Entrypoint,
			Cmd:        Cmd,
			Env:        env,
			WorkingDir: "/",
			ExposedPorts: map[string]struct{}{
				fmt.Sprintf("%d/tcp", ClientPort): {},
				fmt.Sprintf("%d/tcp", AdminPort):  {},
			},
			StopSignal: "SIGTERM",
			Labels: map[string]string{
				LabelTitle:       DefaultRepository,
				LabelDescription: desc,
				LabelVersion:     o.Version,
				LabelRevision:    strings.TrimSpace(o.Revision),
				LabelSource:      source,
				LabelLicenses:    License,
				LabelCreated:     created.Format(time.RFC3339),
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, sum, fmt.Errorf("image config: %w", err)
	}
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: v1.Time{Time: created}, CreatedBy: "deploy/image: /etc/passwd, /etc/group, CA bundle, /tmp",
		}},
		mutate.Addendum{Layer: binLayer, MediaType: types.OCILayer, History: v1.History{
			Created: v1.Time{Time: created}, CreatedBy: "deploy/image: " + BinaryPath,
		}},
	)
	if err != nil {
		return nil, sum, fmt.Errorf("append layers: %w", err)
	}
	return img, sum, nil
}

// CheckStatic checks that path is a statically linked Linux Go executable
// built with -trimpath, and returns its GOARCH.
func CheckStatic(path string) (arch string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("binary %s: not a Linux ELF executable: %w", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("binary %s: ELF type %v is not an executable", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(p.Open(), 256))
			return "", fmt.Errorf("binary %s is dynamically linked (its interpreter is %s): the image has no C library; build it with CGO_ENABLED=0", path, strings.TrimRight(string(interp), "\x00"))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return "", fmt.Errorf("binary %s: read its dynamic section: %w", path, err)
	}
	if len(libs) > 0 {
		return "", fmt.Errorf("binary %s needs shared libraries (%s): build it with CGO_ENABLED=0", path, strings.Join(libs, ", "))
	}
	switch f.Machine {
	case elf.EM_X86_64:
		arch = "amd64"
	case elf.EM_AARCH64:
		arch = "arm64"
	case elf.EM_RISCV:
		arch = "riscv64"
	case elf.EM_PPC64:
		arch = "ppc64le"
	case elf.EM_S390:
		arch = "s390x"
	default:
		return "", fmt.Errorf("binary %s: unsupported machine %v", path, f.Machine)
	}

	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("binary %s: not a Go binary with build information: %w", path, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if goos := settings["GOOS"]; goos != "" && goos != "linux" {
		return "", fmt.Errorf("binary %s was built for GOOS=%s, want linux", path, goos)
	}
	if goarch := settings["GOARCH"]; goarch != "" && goarch != arch {
		return "", fmt.Errorf("binary %s: its build information says GOARCH=%s but its ELF machine is %s", path, goarch, arch)
	}
	if settings["-trimpath"] != "true" {
		return "", fmt.Errorf("binary %s was built without -trimpath: it would carry the build machine's paths; build it with CGO_ENABLED=0 go build -trimpath", path)
	}
	return arch, nil
}

// file is one entry of a layer.
type file struct {
	name     string // without a leading "/"; directories end with "/"
	mode     int64
	uid, gid int
	data     []byte
}

func dir(name string, mode int64) file { return file{name: name, mode: mode} }

// passwd and group name root, nobody and nonroot, as distroless images do.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:65532:\n"
)

// baseFiles are the first layer: users, the CA bundle, /tmp and the
// directories the binary and the configuration go in.
func baseFiles(certs []byte) []file {
	fs := []file{
		dir("etc/", 0o755),
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		dir("etc/inferrail/", 0o755),
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
	}
	if certs != nil {
		fs = append(fs,
			dir("etc/ssl/", 0o755),
			dir("etc/ssl/certs/", 0o755),
			file{name: strings.TrimPrefix(CACertsPath, "/"), mode: 0o644, data: certs})
	}
	return append(fs,
		dir("home/", 0o755),
		file{name: "home/nonroot/", mode: 0o700, uid: UID, gid: GID},
		dir("tmp/", 0o1777),
		dir("usr/", 0o755),
		dir("usr/local/", 0o755),
		dir("usr/local/bin/", 0o755),
	)
}

// binaryFiles are the second layer: the binary, owned by root, mode 0755.
func binaryFiles(bin []byte) []file {
	return []file{
		dir("usr/", 0o755),
		dir("usr/local/", 0o755),
		dir("usr/local/bin/", 0o755),
		{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: bin},
	}
}

// layer writes files as a tar stream with fixed times and owners and
// returns it as a gzip-compressed layer.
func layer(files []file, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			Uid:     f.uid,
			Gid:     f.gid,
			ModTime: mtime,
		}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}

// Build builds the image of o and writes it at out as a docker-archive
// tarball tagged inferrail:VERSION: New, then WriteTarball.
func Build(out string, o Options) (v1.Image, Summary, error) {
	tag, err := Tag(o.Version)
	if err != nil {
		return nil, Summary{}, err
	}
	img, sum, err := New(o)
	if err != nil {
		return nil, sum, err
	}
	if err := WriteTarball(img, tag, out); err != nil {
		return nil, sum, err
	}
	return img, sum, nil
}

// WriteTarball writes img as a docker-archive tarball tagged tag (what
// "podman load -i" and "docker load -i" read) at path. It writes a
// temporary file beside path and renames it, so a failed write leaves no
// partial tarball.
func WriteTarball(img v1.Image, tag name.Tag, path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write image tarball: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tarball.Write(tag, img, tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("write image tarball %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write image tarball %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write image tarball %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write image tarball: %w", err)
	}
	return nil
}

// WriteLayout writes img into an OCI image layout directory dir (created
// if missing, appended to if it is a layout already), its manifest
// annotated with tag as org.opencontainers.image.ref.name.
func WriteLayout(img v1.Image, tag name.Tag, dir string) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		p, err = layout.Write(dir, empty.Index)
		if err != nil {
			return fmt.Errorf("write image layout %s: %w", dir, err)
		}
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
	})); err != nil {
		return fmt.Errorf("write image layout %s: %w", dir, err)
	}
	return nil
}
