package main

import (
	"bytes"
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The docs check: third parties build clients and deployments from docs/*.md and README.md
// alone, so every flag, HTTP route, metric and error or close code the docs name must exist in
// the code, and every flag and route of the code must be documented somewhere. It lives here
// because the flag sets exist only in this package (each command builds its own); the routes,
// metrics and codes are read from the sources and proto/client.proto, so nothing is listed twice.
// It is a plain test, run by `make unit` with or without -short.

// repoRoot is the module's root, two levels above this package.
const repoRoot = "../.."

// docFile is one Markdown file of the docs, by its path from the repository root.
type docFile struct {
	name string
	text string
}

func readDocs(t *testing.T) []docFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	paths = append(paths, filepath.Join(repoRoot, "README.md"))
	var docs []docFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, p)
		docs = append(docs, docFile{name: rel, text: string(b)})
	}
	return docs
}

// A mention is something a doc names, with where: "docs/api.md:12".
type mention struct {
	what, at string
}

// ---- flags ----

// commandFlags returns each command's flag set, by the command as typed ("bench fanout"): the
// commands are the ones usage lists (the bench's scenarios from its <a|b> list), each run with
// --check-config so that it builds its flags and stops.
func commandFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	var cmds [][]string
	for line := range strings.Lines(usage) {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "roomcast" || f[2] != "[flags]" && !strings.HasPrefix(f[2], "<") {
			continue
		}
		if alts, ok := strings.CutPrefix(f[2], "<"); ok {
			for _, a := range strings.Split(strings.TrimSuffix(alts, ">"), "|") {
				cmds = append(cmds, []string{f[1], a})
			}
			continue
		}
		cmds = append(cmds, []string{f[1]})
	}
	if len(cmds) < 5 {
		t.Fatalf("found only these commands in usage: %q", cmds)
	}
	out := map[string]map[string]bool{}
	for _, cmd := range cmds {
		var got *flag.FlagSet
		parsedHook = func(fs *flag.FlagSet) { got = fs }
		var stderr bytes.Buffer
		code := run(context.Background(), append(slices.Clone(cmd), "--check-config"), io.Discard, &stderr)
		parsedHook = nil
		if code != 0 || got == nil {
			t.Fatalf("roomcast %s --check-config: exit %d: %s", strings.Join(cmd, " "), code, stderr.String())
		}
		names := map[string]bool{"help": true} // every command answers --help
		got.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
		out[strings.Join(cmd, " ")] = names
	}
	return out
}

var (
	// docFlag is a --flag in a doc; a trailing *, ... or … names every flag with that prefix.
	// A one-letter flag may be written with one dash (-v).
	docFlag = regexp.MustCompile(`(^|[^A-Za-z0-9_-])(?:--([a-z][a-z0-9-]*(?:\*|\.\.\.|…)?)|-([a-z])\b)`)
	// roomcastCmd is the roomcast command (and the bench's scenario) a flag follows in its
	// context; scenarios listed as conns|fanout name the bench's flags of any.
	roomcastCmd = regexp.MustCompile(`(?:^|[\s/(])roomcast\s+([a-z]+)(?:\s+([a-z]+)(\\?\|)?)?`)
	inlineCode  = regexp.MustCompile("`[^`\n]+`")
)

// flagContexts returns the contexts a doc names flags in: each inline code span, each line of a
// fenced block (with its continuation lines), and each line of prose without its code spans.
// The flags of a context whose text begins with a command other than roomcast (curl --cacert,
// node --experimental-websocket) are that command's and not checked.
func flagContexts(d docFile) []mention {
	var out []mention
	lines := strings.Split(d.text, "\n")
	inBlock := false
	for i := 0; i < len(lines); i++ {
		line, at := lines[i], d.name+":"+strconv.Itoa(i+1)
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			for strings.HasSuffix(strings.TrimSpace(line), `\`) && i+1 < len(lines) {
				i++
				line = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " " + lines[i]
			}
			out = append(out, mention{line, at})
			continue
		}
		for _, span := range inlineCode.FindAllString(line, -1) {
			out = append(out, mention{strings.Trim(span, "`"), at})
		}
		out = append(out, mention{"--- " + inlineCode.ReplaceAllString(line, " "), at}) // prose
	}
	return out
}

// flagMentions returns the roomcast flags each doc names: what is "cmd --flag" (cmd empty when
// the context names no roomcast command).
func flagMentions(docs []docFile) []mention {
	var out []mention
	for _, d := range docs {
		for _, c := range flagContexts(d) {
			// A pipeline's or a list's flags belong to the command of their own part.
			for _, part := range regexp.MustCompile(`\|\s|&&|;`).Split(c.what, -1) {
				text := strings.TrimSpace(part)
				for strings.HasPrefix(text, "$ ") {
					text = strings.TrimSpace(text[2:])
				}
				cmds := roomcastCmd.FindAllStringSubmatchIndex(text, -1)
				ours := strings.HasPrefix(text, "-") || strings.HasPrefix(text, "[") || strings.HasPrefix(text, "--- ")
				if f := strings.Fields(text); len(f) > 0 && strings.Contains(f[0], "=") {
					ours = true // ROOMCAST_X=1 roomcast ...: the environment before the command
				}
				for _, l := range docFlag.FindAllStringSubmatchIndex(text, -1) {
					name := ""
					if l[4] >= 0 {
						name = text[l[4]:l[5]]
					} else {
						name = text[l[6]:l[7]]
					}
					cmd, found := "", false
					for _, m := range cmds {
						if m[1] > l[0] {
							break
						}
						cmd, found = text[m[2]:m[3]], true
						if cmd == "bench" && m[4] >= 0 && m[6] < 0 {
							cmd += " " + text[m[4]:m[5]]
						}
					}
					if !found && !ours {
						continue // another program's flags: curl --cacert, taskset -c
					}
					out = append(out, mention{strings.TrimSpace(cmd + " --" + name), c.at})
				}
			}
		}
	}
	return out
}

// cutAny cuts the first of suffixes that s ends with.
func cutAny(s string, suffixes ...string) (string, bool) {
	for _, suffix := range suffixes {
		if before, ok := strings.CutSuffix(s, suffix); ok {
			return before, true
		}
	}
	return s, false
}

func TestDocsFlags(t *testing.T) {
	cmds := commandFlags(t)
	all := map[string]bool{}
	for _, names := range cmds {
		for n := range names {
			all[n] = true
		}
	}
	has := func(set map[string]bool, name string) bool {
		if prefix, ok := cutAny(name, "*", "...", "…"); ok {
			for n := range set {
				if strings.HasPrefix(n, prefix) {
					return true
				}
			}
			return false
		}
		return set[name]
	}
	documented := map[string]bool{}
	for _, m := range flagMentions(readDocs(t)) {
		cmd, name, _ := strings.Cut(m.what, "--")
		cmd = strings.TrimSpace(cmd)
		set := all
		if s, ok := cmds[cmd]; ok {
			set = s
		} else if cmd == "bench" { // bench without its scenario: any scenario's
			set = map[string]bool{}
			for c, names := range cmds {
				if strings.HasPrefix(c, "bench ") {
					for n := range names {
						set[n] = true
					}
				}
			}
		}
		if !has(set, name) {
			where := "no roomcast command"
			if set != nil && cmd != "" {
				where = "roomcast " + cmd
			}
			if has(all, name) && cmd != "" {
				where += " (another command has it)"
			}
			t.Errorf("%s: --%s: %s has no such flag", m.at, name, where)
		}
		for n := range all {
			if n == name {
				documented[n] = true
			}
		}
	}
	for cmd, names := range cmds {
		for n := range names {
			if !documented[n] {
				t.Errorf("roomcast %s --%s is documented nowhere in docs/*.md or README.md", cmd, n)
			}
		}
	}
}

// ---- HTTP routes ----

// route is an HTTP method (empty: any) and a path pattern of net/http's ServeMux: {name} a
// segment, a trailing / every path below.
type route struct {
	method, path string
}

func (r route) String() string { return strings.TrimSpace(r.method + " " + r.path) }

// goFiles parses every non-test Go file of the module that serves something: not the examples,
// the SDKs or test data. It calls f with each file and its package's directory.
func goFiles(t *testing.T, f func(dir string, file *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(repoRoot, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			switch e.Name() {
			case "examples", "sdk", "testdata", "node_modules", "vendor":
				return filepath.SkipDir
			}
			if strings.HasPrefix(e.Name(), ".") && p != repoRoot {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		f(filepath.Dir(p), file)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stringConsts returns each package's (directory's) string constants, as far as they are made
// of literals and each other.
func stringConsts(t *testing.T) map[string]map[string]string {
	t.Helper()
	pending := map[string]map[string]ast.Expr{}
	goFiles(t, func(dir string, file *ast.File) {
		for _, decl := range file.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						if pending[dir] == nil {
							pending[dir] = map[string]ast.Expr{}
						}
						pending[dir][name.Name] = vs.Values[i]
					}
				}
			}
		}
	})
	out := map[string]map[string]string{}
	for dir, exprs := range pending {
		out[dir] = map[string]string{}
		for name, e := range exprs {
			if s, ok := stringValue(e, func(id string) (string, bool) {
				if e, ok := exprs[id]; ok {
					return stringValue(e, nil)
				}
				return "", false
			}); ok {
				out[dir][name] = s
			}
		}
	}
	return out
}

// stringValue evaluates a string expression of literals, +, and the identifiers lookup knows.
func stringValue(e ast.Expr, lookup func(string) (string, bool)) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		}
	case *ast.Ident:
		if lookup != nil {
			return lookup(e.Name)
		}
	case *ast.ParenExpr:
		return stringValue(e.X, lookup)
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			x, ok1 := stringValue(e.X, lookup)
			y, ok2 := stringValue(e.Y, lookup)
			return x + y, ok1 && ok2
		}
	}
	return "", false
}

// codeRoutes reads the routes the code serves: every mux.Handle and mux.HandleFunc pattern,
// the server API's handle(method, path, ...) table (api/http.go), and the paths a component
// serves outside a mux (a package constant named ...Path, such as the ChatLink's WebSocket
// path), which take GET.
func codeRoutes(t *testing.T) []route {
	t.Helper()
	consts := stringConsts(t)
	seen := map[route]bool{}
	goFiles(t, func(dir string, file *ast.File) {
		lookup := func(id string) (string, bool) { s, ok := consts[dir][id]; return s, ok }
		for _, decl := range file.Decls {
			if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, spec := range g.Specs {
					for _, n := range spec.(*ast.ValueSpec).Names {
						if v, ok := lookup(n.Name); ok && strings.HasSuffix(n.Name, "Path") && strings.HasPrefix(v, "/v1/") {
							seen[route{"GET", v}] = true
						}
					}
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				if fn.Sel.Name != "Handle" && fn.Sel.Name != "HandleFunc" {
					return true
				}
				if pattern, ok := stringValue(call.Args[0], lookup); ok && strings.HasPrefix(pattern, "/") || strings.Contains(pattern, " /") {
					method, path, found := strings.Cut(pattern, " ")
					if !found {
						method, path = "", pattern
					}
					seen[route{method, path}] = true
				}
			case *ast.Ident:
				if fn.Name != "handle" {
					return true
				}
				method, ok1 := stringValue(call.Args[0], lookup)
				path, ok2 := stringValue(call.Args[1], lookup)
				if ok1 && ok2 && strings.HasPrefix(path, "/") {
					seen[route{method, path}] = true
				}
			}
			return true
		})
	})
	var out []route
	for r := range seen {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

var (
	// docRoute is a method and path in a doc: GET /v1/dispatch?app=A.
	docRoute = regexp.MustCompile(`\b(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (/[^\s` + "`" + `)|,;"'\]\[?]*)`)
	// docV1Path is a path of our API anywhere in a doc, a URL's included.
	docV1Path = regexp.MustCompile(`/v1/[A-Za-z0-9_{}$.~:/*…-]*`)
)

// cleanDocPath trims a doc's path to the path itself; prefix says it ended in ... or /*: every
// path below it.
func cleanDocPath(p string) (path string, prefix bool) {
	if s, ok := cutAny(p, "...", "…", "*"); ok {
		return s, true
	}
	return strings.TrimRight(p, ".:"), false
}

// segmentsMatch says whether a doc's path names a route's pattern: a pattern's {name} stands
// for any segment, a pattern's trailing / for every path below it. With exact, a {name} of the
// pattern must be a {name} in the doc too (the doc documents the route, not an example of it).
func segmentsMatch(docPath string, docPrefix bool, pattern string, exact bool) bool {
	pattern, whole := strings.CutSuffix(pattern, "{$}") // {$}: that path only, not those below
	below := strings.HasSuffix(pattern, "/") && !whole
	if below && strings.HasPrefix(docPath, pattern) && !exact {
		return true
	}
	if docPrefix && strings.HasPrefix(pattern, docPath) {
		return true
	}
	d, p := strings.Split(docPath, "/"), strings.Split(pattern, "/")
	if below && len(d) >= len(p) && exact {
		d = d[:len(p)]
		d[len(d)-1] = ""
	}
	if len(d) != len(p) {
		return false
	}
	for i := range p {
		wild := strings.HasPrefix(p[i], "{") && strings.HasSuffix(p[i], "}")
		docWild := strings.HasPrefix(d[i], "{") && strings.HasSuffix(d[i], "}")
		switch {
		case wild && (docWild || !exact && d[i] != ""):
		case !wild && d[i] == p[i]:
		default:
			return false
		}
	}
	return true
}

func TestDocsRoutes(t *testing.T) {
	routes := codeRoutes(t)
	if len(routes) < 20 {
		t.Fatalf("found only %d routes in the code: %v", len(routes), routes)
	}
	type docMention struct {
		method, path string
		prefix       bool
		at           string
	}
	var mentions []docMention
	for _, d := range readDocs(t) {
		for i, line := range strings.Split(d.text, "\n") {
			at := d.name + ":" + strconv.Itoa(i+1)
			withMethod := map[string]bool{}
			for _, m := range docRoute.FindAllStringSubmatch(line, -1) {
				p, prefix := cleanDocPath(m[2])
				mentions = append(mentions, docMention{m[1], p, prefix, at})
				withMethod[p] = true
			}
			for _, m := range docV1Path.FindAllString(line, -1) {
				if p, prefix := cleanDocPath(m); !withMethod[p] { // GET /v1/x is one mention
					mentions = append(mentions, docMention{"", p, prefix, at})
				}
			}
		}
	}
	// A path without a method is checked when its /v1/ section is one of ours (/v1/rooms/...):
	// another service's API (an OpenTelemetry collector's /v1/traces) may be named too.
	sections := map[string]bool{}
	for _, r := range routes {
		if rest, ok := strings.CutPrefix(r.path, "/v1/"); ok {
			sections[strings.Split(rest, "/")[0]] = true
		}
	}
	for _, m := range mentions {
		if rest, ok := strings.CutPrefix(m.path, "/v1/"); ok && m.method == "" && !sections[strings.Split(rest, "/")[0]] {
			continue
		}
		found := false
		for _, r := range routes {
			if (m.method == "" || r.method == "" || r.method == m.method) && segmentsMatch(m.path, m.prefix, r.path, false) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: %s: the code serves no such route", m.at, strings.TrimSpace(m.method+" "+m.path))
		}
	}
	for _, r := range routes {
		documented := false
		for _, m := range mentions {
			if m.method != "" && (r.method == "" || r.method == m.method) && segmentsMatch(m.path, m.prefix, r.path, true) {
				documented = true
				break
			}
		}
		if !documented {
			t.Errorf("route %s is documented nowhere (as %q) in docs/*.md or README.md", r, r.String())
		}
	}
}

// ---- metrics ----

// wholeMetricName is a whole metric name of ours.
var wholeMetricName = regexp.MustCompile(`^roomcast_[a-z0-9_]*[a-z0-9]$`)

// codeMetrics reads the names of the Prometheus metrics the code defines: the Name of each
// prometheus ...Opts literal, joined to its Namespace and Subsystem; where the Name is a helper's
// parameter (c := func(name, help string) ... Opts{Name: "roomcast_x_" + name}), each call of
// the helper with a literal name; and every string literal that is a whole metric name.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	goFiles(t, func(dir string, file *ast.File) {
		// helpers: a func literal assigned to a name, whose Opts' Name uses its first parameter.
		helpers := map[string]func(arg string) string{}
		optsName := func(lit *ast.CompositeLit, param string) (func(string) string, bool) {
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return nil, false
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" {
				return nil, false
			}
			var ns, sub string
			var name ast.Expr
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch k := kv.Key.(*ast.Ident); k.Name {
				case "Namespace":
					ns, _ = stringValue(kv.Value, nil)
				case "Subsystem":
					sub, _ = stringValue(kv.Value, nil)
				case "Name":
					name = kv.Value
				}
			}
			if name == nil {
				return nil, false
			}
			return func(arg string) string {
				v, ok := stringValue(name, func(id string) (string, bool) { return arg, id == param })
				if !ok {
					return ""
				}
				parts := []string{}
				for _, s := range []string{ns, sub, v} {
					if s != "" {
						parts = append(parts, s)
					}
				}
				return strings.Join(parts, "_")
			}, true
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
				fl, ok1 := as.Rhs[0].(*ast.FuncLit)
				id, ok2 := as.Lhs[0].(*ast.Ident)
				if ok1 && ok2 && len(fl.Type.Params.List) > 0 && len(fl.Type.Params.List[0].Names) > 0 {
					param := fl.Type.Params.List[0].Names[0].Name
					ast.Inspect(fl.Body, func(n ast.Node) bool {
						if lit, ok := n.(*ast.CompositeLit); ok {
							if f, ok := optsName(lit, param); ok {
								helpers[id.Name] = f
							}
						}
						return true
					})
				}
			}
			return true
		})
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit: // a whole name kept in a constant or passed on
				if v, ok := stringValue(n, nil); ok && wholeMetricName.MatchString(v) {
					out[v] = true
				}
			case *ast.CompositeLit:
				if f, ok := optsName(n, ""); ok {
					if name := f(""); name != "" {
						out[name] = true
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && helpers[id.Name] != nil && len(n.Args) > 0 {
					if arg, ok := stringValue(n.Args[0], nil); ok {
						out[helpers[id.Name](arg)] = true
					}
				}
			}
			return true
		})
	})
	return out
}

func TestDocsMetrics(t *testing.T) {
	metrics := codeMetrics(t)
	if len(metrics) < 30 {
		t.Fatalf("found only %d metrics in the code: %v", len(metrics), metrics)
	}
	name := regexp.MustCompile(`\broomcast_[a-z0-9_]*[a-z0-9]`)
	for _, d := range readDocs(t) {
		for i, line := range strings.Split(d.text, "\n") {
			for _, m := range name.FindAllString(line, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} { // a histogram's series
					if s, ok := strings.CutSuffix(m, suffix); ok && metrics[s] {
						base = s
					}
				}
				if !metrics[base] {
					t.Errorf("%s:%d: %s: the code defines no such metric", d.name, i+1, m)
				}
			}
		}
	}
}

// ---- error and close codes ----

// protoEnums reads the enums of proto/client.proto (wherever under proto/ it lies): each
// value's number by its name, without the enum's prefix (ERROR_CODE_FORBIDDEN: FORBIDDEN).
func protoEnums(t *testing.T) (byFull map[string]int, pairs map[int][]string) {
	t.Helper()
	var path string
	_ = filepath.WalkDir(filepath.Join(repoRoot, "proto"), func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && e.Name() == "client.proto" {
			path = p
		}
		return nil
	})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("proto/client.proto: %v", err)
	}
	byFull, pairs = map[string]int{}, map[int][]string{}
	value := regexp.MustCompile(`^\s*([A-Z][A-Z0-9_]*)\s*=\s*(\d+)\s*;`)
	enum := regexp.MustCompile(`^\s*enum\s+(\w+)`)
	prefix := ""
	for line := range strings.Lines(string(b)) {
		if m := enum.FindStringSubmatch(line); m != nil {
			// ErrorCode's values are ERROR_CODE_...: the enum's name in capitals with _.
			prefix = strings.ToUpper(regexp.MustCompile(`([a-z0-9])([A-Z])`).ReplaceAllString(m[1], "${1}_${2}")) + "_"
			continue
		}
		if m := value.FindStringSubmatch(line); m != nil && prefix != "" {
			n, _ := strconv.Atoi(m[2])
			byFull[m[1]] = n
			pairs[n] = append(pairs[n], strings.TrimPrefix(m[1], prefix))
		}
		if strings.HasPrefix(strings.TrimSpace(line), "}") {
			prefix = ""
		}
	}
	if len(pairs) < 20 {
		t.Fatalf("%s: found only %d enum values", path, len(pairs))
	}
	return byFull, pairs
}

func TestDocsCodes(t *testing.T) {
	byFull, pairs := protoEnums(t)
	short := map[string]bool{}
	for _, names := range pairs {
		for _, n := range names {
			short[n] = true
		}
	}
	var (
		full = regexp.MustCompile(`\b(?:ERROR|CLOSE)_CODE_[A-Z0-9_]+`)
		// A code and its name: 4010 REPLACED, 103 (FORBIDDEN), | 4010 | `REPLACED` |.
		named = regexp.MustCompile("\\b(\\d{3,4})`?(?: \\(| \\| | )`?([A-Z][A-Z0-9_]{2,})\\b")
		// A code after what carries it: Error 121, Kick 4013, close code 4504.
		bare = regexp.MustCompile(`\b(Error|Kick|[Cc]lose code|[Ee]rror code|Reconnect) ` + "`?" + `(\d{3,4})\b`)
	)
	for _, d := range readDocs(t) {
		for i, line := range strings.Split(d.text, "\n") {
			at := d.name + ":" + strconv.Itoa(i+1)
			for _, m := range full.FindAllString(line, -1) {
				if _, ok := byFull[m]; !ok {
					t.Errorf("%s: %s is no value of proto/client.proto's enums", at, m)
				}
			}
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				n, _ := strconv.Atoi(m[1])
				closeRange := n >= 4000 && n <= 4999 && strings.Contains(m[2], "_")
				if len(pairs[n]) == 0 && !closeRange || !short[m[2]] && !closeRange {
					continue // HTTP 400 BAD_REQUEST (the JSON's name), 370 CPU: not a code and its name
				}
				if !slices.Contains(pairs[n], m[2]) {
					t.Errorf("%s: %s %s: proto/client.proto's %d is %v", at, m[1], m[2], n, pairs[n])
				}
			}
			for _, m := range bare.FindAllStringSubmatch(line, -1) {
				n, _ := strconv.Atoi(m[2])
				if n >= 1000 && n < 4000 { // WebSocket's own close codes (1009)
					continue
				}
				if len(pairs[n]) == 0 {
					t.Errorf("%s: %s %s: proto/client.proto has no code %d", at, m[1], m[2], n)
				}
			}
		}
	}
}

// ---- snapshots ----

// TestDocsSnapshots keeps commit hashes and dates out of docs/: a doc says what is, and when
// something was measured or changed is for the results tables of benchmarks.md and
// reliability.md (their rows may name both) and for git history.
func TestDocsSnapshots(t *testing.T) {
	var (
		date = regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b(?:[^T]|$)`) // not a timestamp in an example (2026-12-01T18:40:02Z)
		hash = regexp.MustCompile("`([0-9a-f]{7,12})`")
	)
	for _, d := range readDocs(t) {
		if !strings.HasPrefix(d.name, "docs"+string(filepath.Separator)) {
			continue
		}
		tables := strings.HasSuffix(d.name, "benchmarks.md") || strings.HasSuffix(d.name, "reliability.md")
		for i, line := range strings.Split(d.text, "\n") {
			if tables && strings.HasPrefix(line, "|") {
				continue
			}
			if m := date.FindString(line); m != "" {
				t.Errorf("%s:%d: a date (%s) outside a results table", d.name, i+1, strings.TrimSpace(m))
			}
			for _, m := range hash.FindAllStringSubmatch(line, -1) {
				if strings.ContainsAny(m[1], "0123456789") && strings.ContainsAny(m[1], "abcdef") {
					t.Errorf("%s:%d: a commit hash (%s) outside a results table", d.name, i+1, m[1])
				}
			}
		}
	}
}
