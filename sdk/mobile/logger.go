package mobile

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// Log levels, for Logger.Log: the Go SDK's (log/slog's) levels.
const (
	LogDebug = int(slog.LevelDebug)
	LogInfo  = int(slog.LevelInfo)
	LogWarn  = int(slog.LevelWarn)
	LogError = int(slog.LevelError)
)

// Logger is what the app implements to receive the Client's few log lines (Config.Logger):
// reconnects, dropped acknowledgements, protocol errors. On Android, pass them to
// android.util.Log; on iOS to os_log. Log may be called from any of the Client's threads and
// must not block.
type Logger interface {
	// Log receives one line: its level (LogDebug, LogInfo, LogWarn, LogError) and its text,
	// the message followed by its attributes as key=value.
	Log(level int, line string)
}

// logHandler is the slog.Handler that passes the Go SDK's records to a Logger.
type logHandler struct {
	l     Logger
	min   slog.Level
	attrs string // " key=value" of WithAttrs, formatted once
	group string // prefix of WithGroup, "a.b."
}

func (h *logHandler) Enabled(_ context.Context, level slog.Level) bool { return level >= h.min }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s%s=%v", h.group, a.Key, a.Value)
		return true
	})
	h.l.Log(int(r.Level), b.String())
	return nil
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := *h
	for _, a := range attrs {
		out.attrs += fmt.Sprintf(" %s%s=%v", h.group, a.Key, a.Value)
	}
	return &out
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	out := *h
	out.group += name + "."
	return &out
}
