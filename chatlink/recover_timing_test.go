package chatlink

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestRecoveryTimingAgrees checks that the two SDKs wait longer for a login's history than the
// ChatLink takes to answer (recoverTimeout), and that docs/protocol.md states the ChatLink's
// bound: an SDK that waits less reports as failed a recovery that the server then completes.
func TestRecoveryTimingAgrees(t *testing.T) {
	find := func(path, pattern string) string {
		t.Helper()
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(pattern).FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s: no match for %q: update this test with the code", path, pattern)
		}
		return string(m[1])
	}
	number := func(s string) int {
		t.Helper()
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	goWait := time.Duration(number(find("../sdk/config.go", `defaultRecoveryWait\s*=\s*(\d+) \* time\.Second`))) * time.Second
	webWait := time.Duration(number(find("../sdk/web/src/config.ts", `positive\(cfg\.recoveryWaitMs, (\d+)\)`))) * time.Millisecond
	for name, wait := range map[string]time.Duration{"Go SDK's RecoveryWait": goWait, "web SDK's recoveryWaitMs": webWait} {
		if wait <= recoverTimeout {
			t.Errorf("the %s default is %v, not more than the ChatLink's %v", name, wait, recoverTimeout)
		}
	}
	docs := time.Duration(number(find("../docs/protocol.md", `The ChatLink gives up reading history\s+after (\d+) s`))) * time.Second
	if docs != recoverTimeout {
		t.Errorf("docs/protocol.md says the ChatLink gives up reading history after %v; it waits %v", docs, recoverTimeout)
	}
}
