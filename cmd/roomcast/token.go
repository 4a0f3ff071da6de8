package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"roomcast/internal/auth"
)

func runToken(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secret := fs.String("secret", "", "the app's token secret (required)")
	app := fs.String("app", "", "app id (required)")
	uid := fs.String("uid", "", "user id (required)")
	room := fs.String("room", "", "room id (required)")
	ttl := fs.Duration("ttl", time.Hour, "how long the token is valid (a ChatLink refuses one valid longer than the app's --token-max-lifetime, 24h by default)")
	tags := fs.String("tags", "", "comma-separated member tags, e.g. class:3,role:student")
	critical := fs.Bool("critical", false, "let the member send critical messages (the token's lanes claim: [\"critical\"]); without it the room's critical_expr decides")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: roomcast token --secret S --app A --uid U --room R [--ttl 1h] [--tags t1,t2] [--critical]

Mints a login token (a JWT signed with HMAC-SHA256) that lets user U join room R of app A, and
prints it. App servers mint tokens the same way with the app's secret. App, user and room ids are
1-128 characters of A-Z a-z 0-9 _ -.

`)
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if *secret == "" || *app == "" || *uid == "" || *room == "" {
		fmt.Fprintln(stderr, "roomcast token: --secret, --app, --uid and --room are required")
		return 2
	}
	var tagList []string
	if *tags != "" {
		tagList = strings.Split(*tags, ",")
	}
	var opts []auth.MintOption
	if *critical {
		opts = append(opts, auth.WithLanes(auth.LaneCritical))
	}
	tok, err := auth.Mint([]byte(*secret), *app, *uid, *room, tagList, *ttl, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast token:", err)
		return 2
	}
	fmt.Fprintln(stdout, tok)
	return 0
}
