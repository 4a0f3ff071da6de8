package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"roomcast/internal/reload"
)

// What a running role takes up without a restart, on SIGHUP and when one of the files it was
// read from changes (internal/reload): the token secrets (--secret), the API keys (--api-key),
// the callbacks file (--callbacks), the dispatcher's pool reservations (--reserve-pool) and the
// log level (-v). The command's configuration is read
// again as at start (command line, environment, --config and the -file / _FILE files); a
// configuration that does not parse, or that the role refuses, changes nothing.

// liveFlagNames are the flags a reload reads again; a role takes those it has.
var liveFlagNames = []string{"secret", "api-key", "callbacks", "reserve-pool", "v"}

// rereadFlags parses the command's configuration again, as parseFlags did at start with args,
// the environment and the --config file, into the flags bind binds on a new flag set; the
// command's other flags (those of orig) are parsed and dropped.
func rereadFlags(orig *flag.FlagSet, args []string, bind func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet(orig.Name(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path, _ := bindConfigFlags(fs)
	bind(fs)
	orig.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.Var(ignoredLike(f.Value), f.Name, f.Usage)
		}
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		*path = os.Getenv(envName("config"))
	}
	return applyConfig(fs, *path, os.LookupEnv)
}

// ignoredLike returns a flag value that takes what v would (one value, several, or none for a
// bool) and keeps nothing.
func ignoredLike(v flag.Value) flag.Value {
	if b, ok := v.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return ignoredBool{}
	}
	if _, ok := v.(repeatable); ok {
		return ignoredList{}
	}
	return ignored{}
}

type ignored struct{}

func (ignored) String() string       { return "" }
func (ignored) Set(string) error     { return nil }
func (ignoredBool) IsBoolFlag() bool { return true }

type ignoredBool struct{ ignored }
type ignoredList struct{ ignored }

func (ignoredList) repeatable() {}

// configFiles returns the files a reload of the live flags reads: the --config file and the
// files their -file keys and _FILE variables name, with extra (the callbacks file).
func configFiles(fs *flag.FlagSet, extra ...string) []string {
	var files []string
	path := ""
	if f := fs.Lookup("config"); f != nil {
		path = f.Value.String()
	}
	if path == "" {
		path = os.Getenv(envName("config"))
	}
	if path != "" {
		files = append(files, path)
		if cf, err := readConfigFile(path); err == nil {
			for _, name := range liveFlagNames {
				if s, ok := cf.sections[fs.Name()][name+fileSuffix]; ok && len(s.values) == 1 {
					files = append(files, s.values[0])
				}
			}
		}
	}
	for _, name := range liveFlagNames {
		if file, ok := os.LookupEnv(envName(name) + "_FILE"); ok && fs.Lookup(name) != nil {
			files = append(files, file)
		}
	}
	for _, f := range extra {
		if f != "" {
			files = append(files, f)
		}
	}
	return files
}

// startReload watches the role's configuration (configFiles, and SIGHUP) and calls load on a
// change; load reads it with rereadFlags and applies it, or applies nothing and fails.
func startReload(fs *flag.FlagSet, log *slog.Logger, reg prometheus.Registerer, load func() error, extra func() []string) (*reload.Watcher, error) {
	w, err := reload.Start(reload.Config{
		Load:       load,
		Files:      func() []string { return configFiles(fs, extra()...) },
		Log:        log,
		Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	return w, nil
}
