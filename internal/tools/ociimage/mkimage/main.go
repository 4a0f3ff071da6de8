// Command mkimage writes the roomcast container image (package ociimage) as an OCI image
// layout directory: `make image` runs it on a static build of cmd/roomcast.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"roomcast/internal/tools/ociimage"
)

func main() {
	var cfg ociimage.Config
	out := flag.String("out", "", "directory to write the image layout to (required; emptied first)")
	flag.StringVar(&cfg.Binary, "binary", "", "the static linux roomcast binary (required)")
	flag.StringVar(&cfg.CACerts, "ca-certs", "", "PEM bundle of CA certificates for /etc/ssl/certs/ca-certificates.crt")
	flag.StringVar(&cfg.Version, "version", "", "the image's version label and tag")
	flag.StringVar(&cfg.Revision, "revision", "", "the commit the binary was built from")
	flag.StringVar(&cfg.Arch, "arch", "amd64", "the binary's GOARCH")
	created := flag.String("created", "0", "the image's time, Unix seconds (the commit's, for a reproducible build)")
	flag.Parse()
	secs, err := strconv.ParseInt(*created, 10, 64)
	if *out == "" || cfg.Binary == "" || err != nil {
		flag.Usage()
		os.Exit(2)
	}
	cfg.Created = time.Unix(secs, 0)
	if err := os.RemoveAll(*out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	digest, err := ociimage.Write(*out, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: roomcast %s %s\n", *out, cfg.Version, digest)
}
