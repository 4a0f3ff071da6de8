package mobile_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"roomcast/internal/auth"
	"roomcast/internal/testkit/testcluster"
)

// javaPackage is the Java package prefix of the bindings TestJava builds, as docs/mobile.md's
// `gomobile bind -javapkg` gives it: the classes are com.example.roomcast.mobile.Client, ...
const javaPackage = "com.example.roomcast"

// TestJava runs the bindings from Java, as an Android app runs them: it generates them with
// gobind, builds their Go side (gobind's JNI glue and this package) into a shared library for
// this machine's JDK (with a stand-in for the NDK's <android/log.h>, testdata/jni), compiles
// the generated Java classes with javac, and runs testdata/java/RoomcastJava.java against a
// cluster with two ChatLinks: two members log in, send, receive, read a history page, offer
// to the room queue, and one of them recovers after the test kills its ChatLink.
func TestJava(t *testing.T) {
	jdk := findJDK(t)
	b := buildJavaBindings(t, jdk)

	start := time.Now()
	c := testcluster.Start(t, testcluster.ChatLinks(2), testcluster.NoMemberCriticalCap())
	token := func(uid string) string {
		tok, err := c.Mint(uid, "java", nil, time.Hour, auth.WithLanes(auth.LaneCritical))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(jdk, "bin", "java"), "-Xmx128m", "-Djava.library.path="+b.lib,
		"-cp", b.classes, "RoomcastJava")
	cmd.Env = append(os.Environ(), "ROOMCAST_DISPATCHER="+c.URL(),
		"ROOMCAST_TOKEN_ALICE="+token("alice"), "ROOMCAST_TOKEN_BOB="+token("bob"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		t.Logf("java: %s", line)
		if node, ok := strings.CutPrefix(line, "KILL "); ok {
			killed := false
			for _, n := range c.Nodes {
				if n.Name() == node {
					n.Kill()
					killed = true
				}
			}
			if !killed {
				t.Errorf("no ChatLink %q to kill", node)
			}
			if _, err := io.WriteString(stdin, "KILLED\n"); err != nil {
				t.Errorf("tell java: %v", err)
			}
		}
	}
	err = cmd.Wait()
	if err != nil || len(lines) == 0 || lines[len(lines)-1] != "OK" {
		t.Fatalf("java RoomcastJava: %v\nstdout:\n%s\nstderr:\n%s", err, strings.Join(lines, "\n"), stderr.Bytes())
	}
	for _, want := range []string{"login bob ", "send ", "receive ", "history ", "queue offer hand-bob", "recovered: true"} {
		if !strings.Contains("\n"+strings.Join(lines, "\n"), "\n"+want) {
			t.Errorf("java printed no line starting %q", want)
		}
	}
	t.Logf("cluster and java program: %v", time.Since(start).Round(time.Millisecond))

	// The Kotlin sample compiles against the same classes.
	t.Run("kotlin", func(t *testing.T) {
		kotlinc := needTool(t, "kotlinc", "kotlinc (Debian's kotlin)")
		start := time.Now()
		cmd := exec.Command(kotlinc, "-nowarn", "-cp", b.classes, "-d", filepath.Join(t.TempDir(), "kotlin"), filepath.Join("testdata", "kotlin", "Room.kt"))
		if out, err := cmd.CombinedOutput(); err != nil { // Debian's kotlinc warns of its JVM options: only a failure counts
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		t.Logf("kotlinc: %v", time.Since(start).Round(time.Millisecond))
	})
}

// javaBindings are the built bindings: the compiled classes (the generated ones, the stand-in
// for android.content.Context and the test's program) and the directory of libgojni.so.
type javaBindings struct {
	classes, lib string
}

// buildJavaBindings generates the Java bindings of this package, builds their Go side into
// libgojni.so (what go.Seq loads) and compiles the Java classes.
func buildJavaBindings(t *testing.T, jdk string) javaBindings {
	t.Helper()
	gobind := findGobind(t)
	needTool(t, "cc", "a C compiler (cgo builds the JNI glue)")
	dir := t.TempDir()
	out, b := filepath.Join(dir, "gobind"), javaBindings{classes: filepath.Join(dir, "classes"), lib: filepath.Join(dir, "lib")}

	start := time.Now()
	run(t, exec.Command(gobind, "-lang=go,java", "-javapkg="+javaPackage, "-outdir="+out, "roomcast/sdk/mobile"))
	t.Logf("gobind: %v", time.Since(start).Round(time.Millisecond))

	// The glue is a main package of its own, built in a workspace with this module, so that it
	// imports this package as it is in the checkout. Its files for Android end in _android,
	// which GOOS=linux would leave out: renamed.
	glue := filepath.Join(dir, "glue")
	if err := os.Rename(filepath.Join(out, "src", "gobind"), glue); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(glue)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base, ext, ok := strings.Cut(f.Name(), "_android."); ok && (ext == "go" || ext == "c") {
			if err := os.Rename(filepath.Join(glue, f.Name()), filepath.Join(glue, base+"_jni."+ext)); err != nil {
				t.Fatal(err)
			}
		}
	}
	root, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.mod"), "module gojni\n\ngo 1.25\n")
	write(t, filepath.Join(dir, "go.work"), fmt.Sprintf("go %s\n\nuse (\n\t.\n\t%s\n)\n",
		strings.TrimPrefix(strings.Fields(runtime.Version())[0], "go"), filepath.Dir(strings.TrimSpace(string(root)))))
	// -llog: the glue links Android's liblog; the stand-in header defines what it calls, so an
	// empty archive answers the flag.
	if err := os.Mkdir(b.lib, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(b.lib, "liblog.a"), "!<arch>\n")
	stub, err := filepath.Abs(filepath.Join("testdata", "jni"))
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(b.lib, "libgojni.so"), ".")
	build.Dir = glue
	build.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=", "CGO_ENABLED=1",
		// __GOBIND_ANDROID__ selects the JNI half of gobind's seq.h. OpenJDK's jni.h declares
		// AttachCurrentThread with void** where Android's has JNIEnv**: a warning the glue's
		// -Werror would make an error.
		"CGO_CFLAGS=-O2 -g -D__GOBIND_ANDROID__ -Wno-incompatible-pointer-types -I"+stub+
			" -I"+filepath.Join(jdk, "include")+" -I"+filepath.Join(jdk, "include", "linux"),
		"CGO_LDFLAGS=-L"+b.lib)
	start = time.Now()
	run(t, build)
	t.Logf("go build -buildmode=c-shared: %v", time.Since(start).Round(time.Millisecond))

	var sources []string
	for _, root := range []string{filepath.Join(out, "java"), filepath.Join("testdata", "java")} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(path, ".java") {
				sources = append(sources, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	run(t, exec.Command(filepath.Join(jdk, "bin", "javac"), append([]string{"-encoding", "UTF-8", "-nowarn", "-d", b.classes}, sources...)...))
	t.Logf("javac: %v", time.Since(start).Round(time.Millisecond))
	return b
}

// findJDK returns the directory of the JDK whose javac is on $PATH (or $JAVA_HOME's): its
// bin/java, bin/javac and include/jni.h. Without one the test skips, but fails in CI
// (CI=true), where `make debs` installs Debian's openjdk-17-jdk-headless.
func findJDK(t *testing.T) string {
	t.Helper()
	javac := os.Getenv("JAVA_HOME")
	if javac != "" {
		javac = filepath.Join(javac, "bin", "javac")
	} else {
		javac = needTool(t, "javac", "a JDK")
	}
	real, err := filepath.EvalSymlinks(javac)
	if err != nil {
		missing(t, "a JDK", err)
	}
	jdk := filepath.Dir(filepath.Dir(real))
	if _, err := os.Stat(filepath.Join(jdk, "include", "jni.h")); err != nil {
		missing(t, "a JDK with its JNI headers", err)
	}
	return jdk
}

// needTool returns the path of the command name, or skips the test (fails it in CI).
func needTool(t *testing.T, name, what string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		missing(t, what, err)
	}
	return path
}

// missing skips the test for want of what, but fails it in CI: there `make debs` installs it.
func missing(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is needed (%v): `make debs` installs it", what, err)
	}
	t.Skipf("%s is needed (%v): `make debs` installs it", what, err)
}

// run runs cmd and fails the test with its output if it fails or says anything on stderr.
func run(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.Bytes())
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
