package chaos

import (
	"os"
	"strings"
	"testing"
)

// TestReportRows checks the writer of `make chaos` against docs/reliability.md as it is: each
// case's row is replaced in place, a new case's row is added at the table's end, and nothing
// outside the table changes. It starts no process, so it runs under -short too.
func TestReportRows(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docs/reliability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	b, e := strings.Index(doc, beginMark), strings.Index(doc, endMark)
	if b < 0 || e < b {
		t.Fatalf("docs/reliability.md lacks the lines %q and %q", beginMark, endMark)
	}
	header := "| case | figures | met | when | commit |"
	if !strings.Contains(doc[b:e], header) {
		t.Fatalf("the generated table's header is not %q", header)
	}
	row := "| TestKillChatLink | new figures | yes | 2026-01-01 00:00 UTC | `abc1234` |"
	got, err := replaceRow(doc, "TestKillChatLink", row)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(got, "| TestKillChatLink |"); n != 1 || !strings.Contains(got, row) {
		t.Fatalf("after the rewrite the table has %d rows of TestKillChatLink:\n%s", n, got)
	}
	if got[:b] != doc[:b] || got[strings.Index(got, endMark):] != doc[e:] {
		t.Error("the rewrite changed the report outside its table")
	}
	again, err := replaceRow(got, "TestKillChatLink", row)
	if err != nil || again != got {
		t.Errorf("a second rewrite with the same row changed the report (err %v)", err)
	}
	added, err := replaceRow(got, "TestNewCase", "| TestNewCase | f | yes | w | `c` |")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(added, "| TestNewCase | f | yes | w | `c` |\n"+endMark) {
		t.Errorf("a new case's row is not the table's last:\n%s", added[strings.Index(added, beginMark):])
	}
	if _, err := replaceRow("no table", "TestKillChatLink", row); err == nil {
		t.Error("a report without the table's lines: no error")
	}
}
