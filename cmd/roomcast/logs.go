package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"roomcast/internal/tracing"
)

// logFlags are the logging and tracing flags every role takes: -v, --log-format, --audit-log,
// --otlp-endpoint and --trace-sample-ratio.
type logFlags struct {
	verbose  bool
	level    slog.LevelVar // the handlers' level: -v's, changed by setVerbose
	format   string
	auditLog string
	tracing  tracing.Config
}

// bindLogFlags binds -v, --log-format and --audit-log.
func bindLogFlags(fs *flag.FlagSet) *logFlags {
	f := &logFlags{}
	fs.BoolVar(&f.verbose, "v", false, "log at debug level")
	fs.StringVar(&f.format, "log-format", "text", "log record format on stderr: text (key=value) or json (one object a line)")
	fs.StringVar(&f.auditLog, "audit-log", "", "file the audit trail (refused logins, moderators' actions, the server API's calls that change something) is appended to, in --log-format, as well as logged with audit=true (empty: only logged)")
	fs.StringVar(&f.tracing.Endpoint, "otlp-endpoint", "", "OpenTelemetry collector's OTLP/HTTP URL to export traces to, such as http://collector:4318 (empty: tracing off)")
	fs.Float64Var(&f.tracing.SampleRatio, "trace-sample-ratio", 1, "share of new traces recorded with --otlp-endpoint, 0 to 1 (a trace begun by a caller's traceparent follows the caller)")
	return f
}

// loggers returns the role's logger, writing to w and naming the role in every record, and its
// audit logger: the same records with audit=true, also appended to --audit-log when it is set.
// It also starts exporting the process's traces when --otlp-endpoint is set. close sends the
// spans still buffered and closes the audit file.
func (f *logFlags) loggers(w io.Writer, role string) (log, audit *slog.Logger, close func(), err error) {
	f.setVerbose(f.verbose)
	newHandler, err := f.handler()
	if err != nil {
		return nil, nil, nil, err
	}
	h := newHandler(w, &slog.HandlerOptions{Level: &f.level})
	log = slog.New(h).With("role", role)
	f.tracing.Service = "roomcast-" + role
	stopTracing, err := tracing.Setup(f.tracing)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--otlp-endpoint: %w", err)
	}
	flush := func() { // sends the spans still buffered
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("tracing: spans not exported", "err", err)
		}
	}
	if f.auditLog == "" {
		return log, log, flush, nil
	}
	file, err := os.OpenFile(f.auditLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		flush()
		return nil, nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	// Every audit record goes to the file whatever -v says: it is at info level or above.
	audit = slog.New(slog.NewMultiHandler(h, newHandler(file, nil))).With("role", role)
	return log, audit, func() { flush(); _ = file.Close() }, nil
}

// setVerbose sets the level of the loggers made by loggers: debug when verbose, else info (a
// reload of -v).
func (f *logFlags) setVerbose(verbose bool) {
	if verbose {
		f.level.Set(slog.LevelDebug)
	} else {
		f.level.Set(slog.LevelInfo)
	}
}

// handler returns the constructor of --log-format's handler.
func (f *logFlags) handler() (func(io.Writer, *slog.HandlerOptions) slog.Handler, error) {
	switch f.format {
	case "text", "":
		return func(w io.Writer, o *slog.HandlerOptions) slog.Handler { return slog.NewTextHandler(w, o) }, nil
	case "json":
		return func(w io.Writer, o *slog.HandlerOptions) slog.Handler { return slog.NewJSONHandler(w, o) }, nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", f.format)
}
