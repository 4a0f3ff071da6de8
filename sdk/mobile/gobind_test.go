package mobile_test

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestGobind runs gobind, what `gomobile bind` runs, to generate the Java and Objective-C
// bindings of this package, and checks that every exported name made it into both: gobind
// skips what it cannot bind with only a comment in the output, so a channel or a uint64 in the
// API would otherwise go unnoticed until an app misses it.
func TestGobind(t *testing.T) {
	gobind := findGobind(t)
	out := t.TempDir()
	cmd := exec.Command(gobind, "-lang=go,java,objc", "-outdir="+out, "roomcast/sdk/mobile")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.Bytes())
	}

	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Fatalf("gobind did not generate %s: %v", rel, err)
		}
		return string(b)
	}
	pkgJava, objcHeader := read("java/mobile/Mobile.java"), read("src/gobind/Mobile.objc.h")

	err := filepath.WalkDir(out, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, "skipped") {
				t.Errorf("%s: %s", strings.TrimPrefix(path, out+"/"), strings.TrimSpace(line))
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	types, consts, funcs := exportedNames(t)
	if len(types) == 0 || len(consts) == 0 || len(funcs) == 0 {
		t.Fatalf("found types %q, constants %q and functions %q in the package", types, consts, funcs)
	}
	for _, name := range types {
		java := read("java/mobile/" + name + ".java")
		if !strings.Contains(java, "public final class "+name+" ") && !strings.Contains(java, "public interface "+name+" ") {
			t.Errorf("java/mobile/%s.java declares no class or interface %s", name, name)
		}
		if !strings.Contains(objcHeader, "@interface Mobile"+name+" ") && !strings.Contains(objcHeader, "@protocol Mobile"+name+" ") {
			t.Errorf("Mobile.objc.h declares no interface or protocol Mobile%s", name)
		}
	}
	for _, name := range consts {
		if !regexp.MustCompile(`static final \w+ ` + name + ` = `).MatchString(pkgJava) {
			t.Errorf("Mobile.java does not declare the constant %s", name)
		}
		if !regexp.MustCompile(`\bMobile` + name + `\b`).MatchString(objcHeader) {
			t.Errorf("Mobile.objc.h does not declare the constant Mobile%s", name)
		}
	}
	for _, name := range funcs {
		javaName := strings.ToLower(name[:1]) + name[1:] // NewClient is newClient
		if !strings.Contains(pkgJava, " "+javaName+"(") {
			t.Errorf("Mobile.java does not declare the function %s", javaName)
		}
		if !strings.Contains(objcHeader, " Mobile"+name+"(") {
			t.Errorf("Mobile.objc.h does not declare the function Mobile%s", name)
		}
	}
}

// findGobind returns the path of the gobind binary `make tools` installs, and fails the test
// if it is missing or not the version go.mod requires.
func findGobind(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("gobind")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
		dirs := strings.Fields(string(gopath))
		if len(dirs) == 2 { // GOBIN is set
			path = filepath.Join(dirs[0], "gobind")
		} else if len(dirs) == 1 {
			path = filepath.Join(dirs[0], "bin", "gobind")
		}
		if _, err = os.Stat(path); err != nil {
			t.Fatalf("gobind is not in $PATH nor at %q (%v): `make tools` installs it", path, err)
		}
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v: `make tools` installs gobind", path, err)
	}
	want, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "golang.org/x/mobile").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = errors.New(string(ee.Stderr))
		}
		t.Fatalf("go list -m golang.org/x/mobile: %v", err)
	}
	if info.Main.Path != "golang.org/x/mobile" || info.Main.Version != strings.TrimSpace(string(want)) {
		t.Fatalf("%s is %s@%s, go.mod wants golang.org/x/mobile@%s: `make tools` installs it",
			path, info.Main.Path, info.Main.Version, strings.TrimSpace(string(want)))
	}
	return path
}

// exportedNames returns the exported types, constants and functions of the package in the
// current directory, tests left out.
func exportedNames(t *testing.T) (types, consts, funcs []string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					funcs = append(funcs, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							types = append(types, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() && d.Tok == token.CONST {
								consts = append(consts, n.Name)
							}
						}
					}
				}
			}
		}
	}
	return types, consts, funcs
}
