// Package image builds inferrail's OCI image from scratch, in Go, without a
// container engine and without pulling a base image.
//
// The image holds a static inferrail binary (CGO_ENABLED=0, -trimpath) at
// /usr/local/bin/inferrail, the host's CA bundle at
// /etc/ssl/certs/ca-certificates.crt (so the gateway can reach engines over
// TLS), /etc/passwd and /etc/group naming the unprivileged user nonroot
// (65532), and a world-writable /tmp. It runs as 65532:65532 with the
// entrypoint /usr/local/bin/inferrail and the command
// "live --config /etc/inferrail/live.yaml", exposes the default client and
// admin ports of live/config (8080 and 9090), and carries the
// org.opencontainers.image.* labels.
//
// The build is reproducible: every file time is the image's creation time
// (SOURCE_DATE_EPOCH or the commit time, chosen by the caller), layers are
// written in a fixed order with fixed owners, and the same binary and
// options give the same image digest.
//
// New builds the image; WriteTarball writes it as a docker-archive tarball
// (what "podman load" and "docker load" read), Build does both, and
// WriteLayout writes an OCI image layout directory. The command
// deploy/image/build wraps them for "make image".
package image
