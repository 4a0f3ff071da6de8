package api

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"roomcast/internal/auth"
	"roomcast/internal/testkit"
)

// A stream's accepted sends are audited as one record per room, with their count and their least
// and greatest ids, at each flush (every streamAuditEvery, and when the stream ends); a flush
// with nothing sent since writes nothing.
func TestStreamAudit(t *testing.T) {
	t.Parallel()
	a := bareAPI(auth.APIKeys{"k1": {App: "demo"}})
	var log testkit.Buffer
	a.audit = slog.New(slog.NewJSONHandler(&log, nil))
	s := &streamAudit{a: a, calls: a.m.callMetrics("grpc", "SendStream"), authz: "Bearer k1", rooms: map[string]*roomSends{}}
	for _, i := range []int{1, 0, 4, 2, 3} { // answered out of order: a critical send waits for its window
		s.add("r2", fmt.Sprintf("id-%d", i))
	}
	s.add("r1", "id-9")
	if log.String() != "" {
		t.Fatalf("audited before a flush:\n%s", log.String())
	}
	s.flush()
	got := strings.Split(strings.TrimSpace(log.String()), "\n")
	want := []string{
		`"msg":"api sends","transport":"grpc","method":"SendStream","app":"demo","key":"` + keyFingerprint("k1") + `","room":"r1","result":"OK","sends":1,"first_id":"id-9","last_id":"id-9"`,
		`"msg":"api sends","transport":"grpc","method":"SendStream","app":"demo","key":"` + keyFingerprint("k1") + `","room":"r2","result":"OK","sends":5,"first_id":"id-0","last_id":"id-4"`,
	}
	if len(got) != len(want) {
		t.Fatalf("audit records:\n%s\nwant %d", log.String(), len(want))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("audit record %d:\n%s\nwant it to hold %s", i, got[i], want[i])
		}
	}
	s.flush()
	if n := strings.Count(log.String(), "\n"); n != 2 {
		t.Errorf("a flush with nothing sent since wrote records:\n%s", log.String())
	}
}
