package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/tools/probe"
	"roomcast/sdk"
)

func runProbe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dispatcher := fs.String("dispatcher", "http://127.0.0.1:8080", "dispatcher base URL")
	room := fs.String("room", "r1", "room the clients join")
	clients := fs.Int("clients", 4, "how many clients join (at least 2)")
	messages := fs.Int("messages", 10, "how many messages each client sends (at least 1)")
	secret := fs.String("secret", devcluster.Secret, "the app's token secret (default: the dev cluster's)")
	app := fs.String("app", devcluster.App, "app id")
	transport := fs.String("transport", sdk.TransportWebSocket, "client transport: ws or tcp")
	timeout := fs.Duration("timeout", 15*time.Second, "limit for the whole run")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: roomcast probe [--dispatcher URL] [--room R] [--clients N] [--messages M]
                     [--transport ws|tcp] [--secret S] [--app A] [--timeout 15s]

An end-to-end check of a running deployment. N clients (uids probe-<run>-<i>) get tokens minted
with the app secret, ask the dispatcher where to connect, and join room R, client i trying the
dispatcher's list from its i-th node on, so that they spread over the nodes it offers (it would
put a room's members together) and cross-node delivery is checked. Then each sends M
messages on the critical lane, waiting for each SendAck, and the probe checks that every other
client receives every message exactly once and that no sender gets its own message back.

It prints one line, e.g.
  probe: clients=4 nodes=2 delivered=120/120 lost=0 dup=0 echo=0 acked=40/40 p50=1.20ms p99=3.40ms max=5.00ms
where nodes counts the distinct ChatLinks the clients landed on and the latencies run from send
to receipt. Exit status: 0 when everything was acked and delivered once, 1 otherwise (details on
stderr), 2 for bad flags.

`)
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	switch {
	case *clients < 2:
		fmt.Fprintln(stderr, "roomcast probe: --clients must be at least 2")
		return 2
	case *messages < 1:
		fmt.Fprintln(stderr, "roomcast probe: --messages must be at least 1")
		return 2
	case *transport != sdk.TransportWebSocket && *transport != sdk.TransportTCP:
		fmt.Fprintf(stderr, "roomcast probe: --transport must be ws or tcp, not %q\n", *transport)
		return 2
	case *timeout <= 0:
		fmt.Fprintln(stderr, "roomcast probe: --timeout must be positive")
		return 2
	case *secret == "" || *app == "" || *room == "" || *dispatcher == "":
		fmt.Fprintln(stderr, "roomcast probe: --secret, --app, --room and --dispatcher must not be empty")
		return 2
	}

	res, err := probe.Run(ctx, probe.Config{
		Dispatcher: *dispatcher,
		Secret:     []byte(*secret),
		App:        *app,
		Room:       *room,
		Clients:    *clients,
		Messages:   *messages,
		Transport:  *transport,
		Timeout:    *timeout,
	})
	fmt.Fprintln(stdout, res)
	for _, e := range res.Errors {
		fmt.Fprintln(stderr, "roomcast probe:", e)
	}
	if err != nil {
		fmt.Fprintln(stderr, "roomcast", err) // err reads "probe: ..."
		return 1
	}
	if !res.OK() {
		return 1
	}
	return 0
}
