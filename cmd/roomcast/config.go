package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Every command's flags can also be set in a YAML config file and in environment variables,
// with nothing to write per flag: a section of the file is named after the command
// (`chatlink:`), its keys are the flag names (`nats:` for --nats), and a variable is
// ROOMCAST_ and the flag name in capitals with '_' for '-' (ROOMCAST_NATS). The command line
// wins over the environment, which wins over the file. A key or variable with the suffix
// -file / _FILE reads the value from a file instead (secrets: ROOMCAST_SECRET_FILE). The
// layering happens in parseFlags, which every command calls, so a flag a command adds is
// configurable as soon as it exists. docs/configuration.md is the user's guide.

const (
	envPrefix  = "ROOMCAST_"
	fileSuffix = "-file"
)

// repeatable is a flag that takes several values, each --flag adding one (--secret,
// --api-key, --cdn-base-url). In the config file it takes a YAML list, in an environment
// variable whitespace-separated entries, in a -file / _FILE one entry per line. A new
// repeatable flag type must implement it.
type repeatable interface {
	flag.Value
	repeatable()
}

func (pairs) repeatable()   {}
func (apiKeys) repeatable() {}
func (*urls) repeatable()   {}

// envName is the environment variable of a flag: ROOMCAST_NATS for --nats.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// configSetting is one flag's values from the file or the environment, with where they come
// from for error messages ("roomcast.yaml:12", "$ROOMCAST_NATS").
type configSetting struct {
	values []string
	from   string
	list   bool // the file gave a YAML list
}

// configFile is a parsed config file: per section (command), per key, the values.
type configFile struct {
	path     string
	sections map[string]map[string]configSetting
	order    []string // the sections in file order
}

// readConfigFile parses a config file: a YAML mapping of sections, each a mapping of keys to
// a scalar or a list of scalars. Values are kept as written and parsed by the flags, so YAML's
// own typing never reinterprets one (no: stays "no").
func readConfigFile(path string) (*configFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	cf := &configFile{path: path, sections: map[string]map[string]configSetting{}}
	if len(doc.Content) == 0 { // an empty file
		return cf, nil
	}
	at := func(n *yaml.Node) string { return fmt.Sprintf("%s:%d", path, n.Line) }
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping of sections named after commands (chatlink:, services:, ...)", at(root))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		name, body := root.Content[i], root.Content[i+1]
		if _, dup := cf.sections[name.Value]; dup {
			return nil, fmt.Errorf("%s: section %q appears twice", at(name), name.Value)
		}
		keys := map[string]configSetting{}
		cf.sections[name.Value] = keys
		cf.order = append(cf.order, name.Value)
		if body.Kind == yaml.ScalarNode && body.Tag == "!!null" {
			continue
		}
		if body.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s: section %q: want a mapping of flag names to values", at(body), name.Value)
		}
		for j := 0; j+1 < len(body.Content); j += 2 {
			key, val := body.Content[j], body.Content[j+1]
			if _, dup := keys[key.Value]; dup {
				return nil, fmt.Errorf("%s: key %q appears twice in section %q", at(key), key.Value, name.Value)
			}
			s := configSetting{from: at(key)}
			switch val.Kind {
			case yaml.ScalarNode:
				s.values = []string{val.Value}
			case yaml.SequenceNode:
				s.list = true
				for _, item := range val.Content {
					if item.Kind != yaml.ScalarNode {
						return nil, fmt.Errorf("%s: key %q: want a list of values", at(item), key.Value)
					}
					s.values = append(s.values, item.Value)
				}
			default:
				return nil, fmt.Errorf("%s: key %q: want a value or a list of values", at(val), key.Value)
			}
			keys[key.Value] = s
		}
	}
	return cf, nil
}

// bindConfigFlags adds --config and --check-config to a command's flags.
func bindConfigFlags(fs *flag.FlagSet) (path *string, check *bool) {
	path = fs.String("config", "", fmt.Sprintf("YAML config file: its section %q sets any of these flags by name (nats: URL); each flag is also read from $%s<FLAG> (%s); flags on the command line win over the environment, which wins over the file; a key or variable ending in %s / _FILE reads the value from that file (docs/configuration.md)", fs.Name(), envPrefix, envName("nats"), fileSuffix))
	check = fs.Bool("check-config", false, "check the configuration (flags, environment, --config) and exit: 0 when every key is a flag of this command and every value parses")
	return path, check
}

// applyConfig sets the flags that the command line left unset from the environment (lookup)
// or, failing that, from the config file at path (none when empty), which must only hold
// flags of this command in its section.
func applyConfig(fs *flag.FlagSet, path string, lookup func(string) (string, bool)) error {
	onArgv := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onArgv[f.Name] = true })
	settings := map[string]configSetting{}
	if path != "" {
		cf, err := readConfigFile(path)
		if err != nil {
			return err
		}
		for key, s := range cf.sections[fs.Name()] {
			name, fromFile := key, false
			if fs.Lookup(name) == nil && strings.HasSuffix(name, fileSuffix) {
				name, fromFile = strings.TrimSuffix(name, fileSuffix), true
			}
			if fs.Lookup(name) == nil || name == "config" || name == "check-config" {
				return fmt.Errorf("%s: unknown key %q in section %q: not a flag of roomcast %s (see roomcast %s --help)", s.from, key, fs.Name(), fs.Name(), fs.Name())
			}
			if fromFile {
				if len(s.values) != 1 {
					return fmt.Errorf("%s: key %q: want one file name", s.from, key)
				}
				if s, err = readValueFile(s.values[0], s.from, fs.Lookup(name)); err != nil {
					return err
				}
			}
			if prev, dup := settings[name]; dup {
				return fmt.Errorf("%s: key %q sets the same flag as %s", s.from, key, prev.from)
			}
			settings[name] = s
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || f.Name == "config" || f.Name == "check-config" {
			return
		}
		env := envName(f.Name)
		if v, ok := lookup(env); ok {
			s := configSetting{values: []string{v}, from: "$" + env}
			if _, many := f.Value.(repeatable); many {
				s.values = strings.Fields(v)
			}
			settings[f.Name] = s
		} else if file, ok := lookup(env + "_FILE"); ok {
			var s configSetting
			if s, err = readValueFile(file, "$"+env+"_FILE", f); err == nil {
				settings[f.Name] = s
			}
		}
	})
	if err != nil {
		return err
	}
	for name, s := range settings {
		if onArgv[name] {
			continue
		}
		f := fs.Lookup(name)
		if _, many := f.Value.(repeatable); !many && s.list {
			return fmt.Errorf("%s: %s takes one value, not a list", s.from, name)
		}
		for _, v := range s.values {
			if err := fs.Set(name, v); err != nil {
				return fmt.Errorf("%s: invalid value %q for %s: %w", s.from, v, name, err)
			}
		}
	}
	return nil
}

// readValueFile reads a flag's value from a file (a secret): the whole file less surrounding
// white space, or for a repeatable flag one value per non-empty line.
func readValueFile(path, from string, f *flag.Flag) (configSetting, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return configSetting{}, fmt.Errorf("%s: %w", from, err)
	}
	s := configSetting{from: from + " (" + path + ")"}
	if _, many := f.Value.(repeatable); !many {
		s.values = []string{strings.TrimSpace(string(data))}
		return s, nil
	}
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" {
			s.values = append(s.values, line)
		}
	}
	return s, nil
}

// runConfig runs `roomcast config check FILE`: each section must be a command whose flags
// take it (and the environment this runs with).
func runConfig(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprint(stderr, "Usage: roomcast config check FILE\n\nChecks a config file: every section is a command (chatlink, services, ...), every key one of\nits flags, every value valid for the flag (the environment's ROOMCAST_* variables are checked\ntoo). Exit 0 when it is, else 1 with the first problem on one line. docs/configuration.md\ndescribes the file.\n")
		return 2
	}
	path := args[1]
	cf, err := readConfigFile(path)
	if err != nil {
		fmt.Fprintln(stderr, "roomcast config:", oneLine(err.Error()))
		return 1
	}
	for _, section := range cf.order {
		cmd := strings.Fields(section) // "bench fanout" is the bench command's fanout flags
		if len(cmd) == 0 || !isCommand(cmd[0]) || cmd[0] == "config" || cmd[0] == "version" {
			fmt.Fprintf(stderr, "roomcast config: %s: section %q is not a command with flags (chatlink, services, cdnpusher, dev, ...)\n", path, section)
			return 1
		}
		var out bytes.Buffer
		if code := run(ctx, append(cmd, "--config", path, "--check-config"), io.Discard, &out); code != 0 {
			line, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
			fmt.Fprintln(stderr, line)
			return 1
		}
	}
	fmt.Fprintf(stdout, "%s: ok (%s)\n", path, strings.Join(cf.order, ", "))
	return 0
}

// isCommand says whether usage lists the command.
func isCommand(name string) bool {
	for line := range strings.Lines(usage) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "roomcast" && f[1] == name {
			return true
		}
	}
	return false
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
