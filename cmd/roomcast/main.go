// Command roomcast is Roomcast's one binary: each subcommand runs a role or a tool.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `roomcast: large-room chat and danmaku distribution.

Usage:
  roomcast dev       [flags]   everything in one process, with a demo page
  roomcast chatlink  [flags]   one ChatLink edge node
  roomcast services  [flags]   room and presence services, dispatcher, server API, CDN manager
  roomcast cdnpusher [flags]   one CDN pusher: rooms' CDN lanes as segments on S3
  roomcast drain     [flags]   ask a ChatLink to hand its clients to other nodes and stop
  roomcast token     [flags]   mint a login token for a client
  roomcast probe     [flags]   end-to-end check: clients join a room and exchange messages
  roomcast bench     <conns|fanout|login|cdn|upload> [flags]   load generator: memory
                               per connection, room fan-out, login rate, the CDN path,
                               members' own sends
  roomcast config    check FILE   check a config file (docs/configuration.md)
  roomcast version             the build: module version, commit, Go version

Run 'roomcast <command> --help' for a command's flags. Every flag can also be set in a config
file (--config FILE, section <command>) or as $ROOMCAST_<FLAG>: docs/configuration.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one subcommand and returns the process exit code: 0 success, 1 failure,
// 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "dev":
		return runDev(ctx, rest, stdout, stderr)
	case "chatlink":
		return runChatLink(ctx, rest, stdout, stderr)
	case "services":
		return runServices(ctx, rest, stdout, stderr)
	case "cdnpusher":
		return runCdnPusher(ctx, rest, stdout, stderr)
	case "drain":
		return runDrain(ctx, rest, stdout, stderr)
	case "token":
		return runToken(rest, stdout, stderr)
	case "probe":
		return runProbe(ctx, rest, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, stdout, stderr)
	case "config":
		return runConfig(ctx, rest, stdout, stderr)
	case "version":
		return runVersion(rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "roomcast: unknown command %q\n\n%s", cmd, usage)
	return 2
}
