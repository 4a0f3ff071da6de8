package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// logFlags are the logging flags every role takes: -v, --log-format and --audit-log.
type logFlags struct {
	verbose  bool
	format   string
	auditLog string
}

// bindLogFlags binds -v, --log-format and --audit-log.
func bindLogFlags(fs *flag.FlagSet) *logFlags {
	f := &logFlags{}
	fs.BoolVar(&f.verbose, "v", false, "log at debug level")
	fs.StringVar(&f.format, "log-format", "text", "log record format on stderr: text (key=value) or json (one object a line)")
	fs.StringVar(&f.auditLog, "audit-log", "", "file the audit trail (refused logins, the server API's calls that change something) is appended to, in --log-format, as well as logged with audit=true (empty: only logged)")
	return f
}

// loggers returns the role's logger, writing to w and naming the role in every record, and its
// audit logger: the same records with audit=true, also appended to --audit-log when it is set.
// close closes the audit file.
func (f *logFlags) loggers(w io.Writer, role string) (log, audit *slog.Logger, close func(), err error) {
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	newHandler, err := f.handler()
	if err != nil {
		return nil, nil, nil, err
	}
	h := newHandler(w, &slog.HandlerOptions{Level: level})
	log = slog.New(h).With("role", role)
	if f.auditLog == "" {
		return log, log, func() {}, nil
	}
	file, err := os.OpenFile(f.auditLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--audit-log: %w", err)
	}
	// Every audit record goes to the file whatever -v says: it is at info level or above.
	audit = slog.New(slog.NewMultiHandler(h, newHandler(file, nil))).With("role", role)
	return log, audit, func() { _ = file.Close() }, nil
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
