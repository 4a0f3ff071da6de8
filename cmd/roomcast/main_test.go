package main

import (
	"bytes"
	"context"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/devcluster"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader in different goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDevThenProbe runs `roomcast dev` and `roomcast probe` against it, as the README's quick
// start does, then stops dev the way Ctrl-C does.
func TestDevThenProbe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var devOut, devErr syncBuffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"dev", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, &devOut, &devErr)
	}()
	var url string
	re := regexp.MustCompile(`dispatch\s+(http://\S+)/v1/dispatch`)
	deadline := time.Now().Add(20 * time.Second)
	for url == "" {
		if m := re.FindStringSubmatch(devOut.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			cancel()
			t.Fatalf("dev printed no banner in 20s; stderr:\n%s", devErr.String())
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, want := range []string{"demo page", "chatlink cl-1", "chatlink cl-2", "roomcast token --secret " + devcluster.Secret} {
		if !strings.Contains(devOut.String(), want) {
			t.Errorf("banner lacks %q:\n%s", want, devOut.String())
		}
	}

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"probe", "--dispatcher", url, "--room", "r1", "--clients", "4", "--messages", "25"}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "delivered=300/300") || !strings.Contains(out.String(), "nodes=2") {
		t.Fatalf("probe exit %d:\n%s%s", code, out.String(), errOut.String())
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited %d: %s", code, devErr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dev did not stop within 10s of the interrupt")
	}
}

func TestToken(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"token", "--secret", "s3", "--app", "a", "--uid", "u", "--room", "r", "--tags", "class:3,role:student"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	c, err := auth.Keyring{"a": []byte("s3")}.Verify(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	if c.UID != "u" || c.Room != "r" || strings.Join(c.Tags, ",") != "class:3,role:student" {
		t.Fatalf("claims %+v", c)
	}
	for _, args := range [][]string{
		{"token", "--app", "a", "--uid", "u", "--room", "r"},                    // no secret
		{"token", "--secret", "s", "--app", "a", "--uid", "u u", "--room", "r"}, // bad uid
		{"nonsense"},
		{},
	} {
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code := run(context.Background(), []string{"token", "--help"}, &out, &errOut); code != 0 {
		t.Errorf("token --help: exit %d", code)
	}
}

// TestPackagesHaveDocs checks that every package in the module says what it is for.
func TestPackagesHaveDocs(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		files, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		documented := map[string]bool{} // by package name
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			documented[f.Name.Name] = documented[f.Name.Name] || (f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "")
		}
		for name, ok := range documented {
			if !ok {
				t.Errorf("package %s (%s) has no doc comment", name, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("walked from %s, which is not the module root: %v", root, err)
	}
}
