// Package ociimage writes the roomcast container image: an OCI image layout (a directory that
// `skopeo copy oci:DIR docker://REGISTRY/roomcast:TAG`, `crane push`, podman and containerd
// take) of one layer holding the static binary, the CA certificates, a passwd file naming the
// non-root user it runs as, and /tmp. It needs no container runtime or daemon, and the same
// binary and inputs give the same image, byte for byte (fixed file times and owners, no
// timestamps but Config.Created). Unpack reads an image layout back into a directory, for
// tests that run the image's own files without a runtime. It builds images only: it pushes
// nothing.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// User is the user and group id the image runs as: not root.
const User = 65532

// BinaryPath is where the image holds the binary; it is on the image's PATH.
const BinaryPath = "usr/local/bin/roomcast"

// Config describes the image.
type Config struct {
	// Binary is the roomcast binary to put in the image: static (CGO_ENABLED=0), for
	// linux. Required.
	Binary string
	// CACerts is a PEM bundle of CA certificates for the image's
	// /etc/ssl/certs/ca-certificates.crt (S3 and OTLP over TLS). Zero value means none.
	CACerts string
	// Version and Revision label the image (org.opencontainers.image.version, .revision).
	Version, Revision string
	// Created is the image's creation time and every file's time: the commit's time makes the
	// build reproducible. Zero value means the Unix epoch.
	Created time.Time
	// Arch is the image's architecture (GOARCH). Zero value means amd64.
	Arch string
}

// Write writes the image layout to dir, which must not exist or be empty, and returns the
// manifest's digest.
func Write(dir string, cfg Config) (string, error) {
	if cfg.Binary == "" {
		return "", errors.New("ociimage: Config.Binary is required")
	}
	if cfg.Arch == "" {
		cfg.Arch = "amd64"
	}
	created := cfg.Created.UTC()
	if cfg.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	layer, diffID, err := buildLayer(cfg, created)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o755); err != nil {
		return "", err
	}
	put := func(b []byte) (descriptor, error) {
		sum := sha256.Sum256(b)
		d := descriptor{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
		return d, os.WriteFile(filepath.Join(dir, "blobs", "sha256", hex.EncodeToString(sum[:])), b, 0o644)
	}
	layerDesc, err := put(layer)
	if err != nil {
		return "", err
	}
	layerDesc.MediaType = "application/vnd.oci.image.layer.v1.tar+gzip"
	labels := map[string]string{
		"org.opencontainers.image.title":    "roomcast",
		"org.opencontainers.image.version":  cfg.Version,
		"org.opencontainers.image.revision": cfg.Revision,
	}
	config, _ := json.Marshal(imageConfig{
		Created: created.Format(time.RFC3339), Architecture: cfg.Arch, OS: "linux",
		Config: RunConfig{
			User:       fmt.Sprintf("%d:%d", User, User),
			Entrypoint: []string{"/" + BinaryPath},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
			WorkingDir: "/tmp",
			Labels:     labels,
		},
		RootFS: rootFS{Type: "layers", DiffIDs: []string{diffID}},
	})
	configDesc, err := put(config)
	if err != nil {
		return "", err
	}
	configDesc.MediaType = "application/vnd.oci.image.config.v1+json"
	manifest, _ := json.Marshal(imageManifest{
		SchemaVersion: 2, MediaType: "application/vnd.oci.image.manifest.v1+json",
		Config: configDesc, Layers: []descriptor{layerDesc}, Annotations: labels,
	})
	manifestDesc, err := put(manifest)
	if err != nil {
		return "", err
	}
	manifestDesc.MediaType = "application/vnd.oci.image.manifest.v1+json"
	manifestDesc.Annotations = map[string]string{"org.opencontainers.image.ref.name": cfg.Version}
	index, _ := json.Marshal(imageIndex{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: []descriptor{manifestDesc}})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return "", err
	}
	return manifestDesc.Digest, nil
}

// buildLayer returns the gzipped layer and the digest of its uncompressed tar (the diff id).
func buildLayer(cfg Config, mtime time.Time) (layer []byte, diffID string, err error) {
	bin, err := os.ReadFile(cfg.Binary)
	if err != nil {
		return nil, "", fmt.Errorf("ociimage: %w", err)
	}
	var ca []byte
	if cfg.CACerts != "" {
		if ca, err = os.ReadFile(cfg.CACerts); err != nil {
			return nil, "", fmt.Errorf("ociimage: %w", err)
		}
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(b)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/tmp:/sbin/nologin\n", User, User)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", User)
	steps := []func() error{
		func() error { return dir("etc", 0o755) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("etc/ssl", 0o755) },
		func() error { return dir("etc/ssl/certs", 0o755) },
		func() error {
			if ca == nil {
				return nil
			}
			return file("etc/ssl/certs/ca-certificates.crt", 0o644, ca)
		},
		func() error { return dir("tmp", 0o1777) },
		func() error { return dir("usr", 0o755) },
		func() error { return dir("usr/local", 0o755) },
		func() error { return dir("usr/local/bin", 0o755) },
		func() error { return file(BinaryPath, 0o755, bin) },
		tw.Close,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, "", fmt.Errorf("ociimage: layer: %w", err)
		}
	}
	sum := sha256.Sum256(raw.Bytes())
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no time: reproducible
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Unpack extracts the first image of the layout at dir into root, layer after layer, and
// returns the image's configuration (its User, Entrypoint, Env, Labels). It takes regular
// files and directories, which is what Write makes, and refuses paths that leave root.
func Unpack(dir, root string) (RunConfig, error) {
	var index imageIndex
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return RunConfig{}, err
	}
	if len(index.Manifests) == 0 {
		return RunConfig{}, errors.New("ociimage: index.json lists no image")
	}
	var manifest imageManifest
	if err := readJSON(blobPath(dir, index.Manifests[0].Digest), &manifest); err != nil {
		return RunConfig{}, err
	}
	var config imageConfig
	if err := readJSON(blobPath(dir, manifest.Config.Digest), &config); err != nil {
		return RunConfig{}, err
	}
	for _, l := range manifest.Layers {
		if err := unpackLayer(blobPath(dir, l.Digest), root); err != nil {
			return RunConfig{}, err
		}
	}
	return config.Config, nil
}

func unpackLayer(path, root string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("ociimage: %s: %w", path, err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("ociimage: %s: %w", path, err)
		}
		name := filepath.Join(root, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(root)+string(filepath.Separator)) {
			return fmt.Errorf("ociimage: %s: %q leaves the root", path, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if err := os.WriteFile(name, b, os.FileMode(h.Mode)&0o777); err != nil {
				return err
			}
		default:
			return fmt.Errorf("ociimage: %s: %q: entry type %c not supported", path, h.Name, h.Typeflag)
		}
	}
}

func blobPath(dir, digest string) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("ociimage: %s: %w", path, err)
	}
	return nil
}

// The parts of the OCI image spec that Write writes and Unpack reads.
type (
	descriptor struct {
		MediaType   string            `json:"mediaType,omitempty"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	imageIndex struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}
	imageManifest struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     string            `json:"mediaType"`
		Config        descriptor        `json:"config"`
		Layers        []descriptor      `json:"layers"`
		Annotations   map[string]string `json:"annotations,omitempty"`
	}
	imageConfig struct {
		Created      string    `json:"created"`
		Architecture string    `json:"architecture"`
		OS           string    `json:"os"`
		Config       RunConfig `json:"config"`
		RootFS       rootFS    `json:"rootfs"`
	}
	rootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	}
)

// RunConfig is how the image runs: the config part of the OCI image configuration.
type RunConfig struct {
	User       string            `json:"User"`
	Entrypoint []string          `json:"Entrypoint"`
	Env        []string          `json:"Env"`
	WorkingDir string            `json:"WorkingDir"`
	Labels     map[string]string `json:"Labels"`
}
