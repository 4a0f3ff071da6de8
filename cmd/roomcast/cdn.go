package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"roomcast/cdnmanager"
	"roomcast/cdnpusher"
	"roomcast/internal/roles"
	"roomcast/store/cdnstore"
)

// urls is a repeatable flag of strings: URLs, proxies.
type urls []string

func (u *urls) String() string     { return strings.Join(*u, ",") }
func (u *urls) Set(s string) error { *u = append(*u, s); return nil }

// bindS3Flags binds the object storage flags of a CDN pusher. Like every flag, each can be set
// by an environment variable (config.go), which is where credentials belong: a command line is
// visible to other users.
func bindS3Flags(fs *flag.FlagSet, c *cdnpusher.Config) {
	fs.StringVar(&c.Endpoint, "s3-endpoint", "", "S3 endpoint host[:port] the segments are written to ($ROOMCAST_S3_ENDPOINT)")
	fs.StringVar(&c.Bucket, "s3-bucket", "", "S3 bucket of the segments ($ROOMCAST_S3_BUCKET)")
	fs.StringVar(&c.Region, "s3-region", "", "the bucket's region (empty: ask the endpoint) ($ROOMCAST_S3_REGION)")
	fs.StringVar(&c.AccessKey, "s3-access-key", "", "S3 access key ($ROOMCAST_S3_ACCESS_KEY)")
	fs.StringVar(&c.SecretKey, "s3-secret-key", "", "S3 secret key; prefer the environment variable ($ROOMCAST_S3_SECRET_KEY)")
	fs.BoolVar(&c.Secure, "s3-secure", false, "talk HTTPS to the S3 endpoint ($ROOMCAST_S3_SECURE=true)")
	fs.StringVar(&c.Prefix, "s3-prefix", "", "key prefix of the segments, e.g. \"roomcast/\" ($ROOMCAST_S3_PREFIX)")
	fs.IntVar(&c.MaxMessages, "cdn-max-messages", cdnpusher.DefaultMaxMessages, "a segment's cap of messages per room and window; beyond it they are sampled")
	fs.DurationVar(&c.SegmentTTL, "segment-ttl", cdnpusher.DefaultSegmentTTL, "how long a segment stays in the bucket after its window ends; then the pusher deletes it (0: the default; negative: never delete)")
}

// bindCDNWindowFlag binds --cdn-window, which the manager and the pushers must agree on.
func bindCDNWindowFlag(fs *flag.FlagSet, window *time.Duration) {
	fs.DurationVar(window, "cdn-window", cdnstore.DefaultWindow, "the CDN segments' window, the same for the services and every pusher")
}

// bindCDNManagerFlags binds the CDN manager's flags of the services role; after parsing, the
// returned function checks them and sets them in the config.
func bindCDNManagerFlags(fs *flag.FlagSet, c *cdnmanager.Config) {
	fs.Var((*urls)(&c.BaseURLs), "cdn-base-url", "public base URL of the segments (a CDN in front of the bucket and prefix), repeatable: the default vendors of apps that set none")
	fs.Int64Var(&c.OnlineThreshold, "cdn-online-threshold", 0, "members online that put a room in CDN mode, for apps whose policy sets none (0 or negative: never; clients that do not poll segments miss the moved lanes)")
	fs.Float64Var(&c.FlowControlLevel, "cdn-flow-level", 0, "ChatLink flow-control strength (0-1) that puts its rooms in CDN mode, for apps whose policy sets none (0 or negative: never; clients that do not poll segments miss the moved lanes)")
}

func runCdnPusher(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdnpusher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg roles.PusherConfig
	bindNATSFlag(fs, &cfg.NATSURL)
	fs.StringVar(&cfg.Pusher.ID, "id", "", "this pusher's name in the CDN routes (empty: pusher-<random>, new at every start)")
	bindS3Flags(fs, &cfg.Pusher.Pusher)
	bindCDNWindowFlag(fs, &cfg.Pusher.Pusher.Window)
	fs.StringVar(&cfg.OpsListen, "ops", "127.0.0.1:9401", "address of /metrics, /healthz, /readyz, /livez and /debug/pprof/ (keep it private)")
	bindKVReplicasFlag(fs, &cfg.Pusher.KVReplicas)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: roomcast cdnpusher --nats URL --s3-endpoint HOST --s3-bucket B [flags]

Runs one CDN pusher: it takes the CDN lanes of the rooms the CDN manager (in roomcast services)
gives it, aggregates them per window and writes one segment per room and window to S3
(docs/cdn.md). Run as many as you like: the manager spreads the rooms over them and moves the
rooms of a pusher that stops. SIGTERM or Ctrl-C hands its rooms to the others first.

`)
		fs.PrintDefaults()
	}
	logFlags := bindLogFlags(fs)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if cfg.Pusher.Pusher.Endpoint == "" || cfg.Pusher.Pusher.Bucket == "" {
		fmt.Fprintln(stderr, "roomcast cdnpusher: --s3-endpoint and --s3-bucket are required")
		return 2
	}
	logs := &heldLog{out: stderr}
	log, _, closeAudit, err := logFlags.loggers(logs, "cdnpusher")
	if err != nil {
		fmt.Fprintln(stderr, "roomcast cdnpusher:", err)
		return 2
	}
	defer closeAudit()
	cfg.Log = log
	p, err := roles.StartPusher(cfg)
	if err != nil {
		logs.drop()
		return startFailed(stderr, "cdnpusher", err, map[string]string{"ops": "--ops"})
	}
	logs.release()
	cfg.Log.Info("cdn pusher running", "id", p.Service.ID(), "ops", p.OpsAddr())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		cfg.Log.Warn("shutdown", "err", err)
	}
	return 0
}
