package main

import (
	"fmt"
	"io"
	"runtime/debug"
)

// stampedVersion and stampedCommit are the version and commit a build without Go's version
// control stamping was given with -ldflags "-X main.stampedVersion=... -X main.stampedCommit=..."
// (make image does so); the build information's win over them.
var stampedVersion, stampedCommit string

// runVersion prints what the binary was built from: the module's version (a tag, or
// "(devel)" for a build from a checkout), the commit and whether the tree had changes, and the
// Go version.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "Usage: roomcast version")
		return 2
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stderr, "roomcast version: the binary carries no build information")
		return 1
	}
	fmt.Fprint(stdout, versionText(info))
	return 0
}

// versionText is the version's lines: module, commit, go.
func versionText(info *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	commit := settings["vcs.revision"]
	if commit == "" {
		commit = stampedCommit
	}
	version := info.Main.Version
	if stampedVersion != "" && (version == "" || version == "(devel)") {
		version = stampedVersion
	}
	if commit == "" {
		commit = "unknown (built without version control information)"
	} else {
		if t := settings["vcs.time"]; t != "" {
			commit += " " + t
		}
		if settings["vcs.modified"] == "true" {
			commit += " (modified)"
		}
	}
	return fmt.Sprintf("roomcast %s\ncommit   %s\ngo       %s %s/%s\n", version, commit, info.GoVersion, settings["GOOS"], settings["GOARCH"])
}
