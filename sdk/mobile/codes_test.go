package mobile

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"roomcast/proto/clientpb"
)

// TestCodesMatchTheProtocol: codes.go names every error and close code of the protocol, by
// the protocol's name and value (ERROR_CODE_SEND_RATE_LIMITED is ErrorSendRateLimited, 120).
func TestCodesMatchTheProtocol(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "codes.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]int{}
	ast.Inspect(f, func(n ast.Node) bool {
		if v, ok := n.(*ast.ValueSpec); ok {
			if lit, ok := v.Values[0].(*ast.BasicLit); ok {
				consts[v.Names[0].Name], _ = strconv.Atoi(lit.Value)
			}
		}
		return true
	})
	camel := func(s string) string {
		var b strings.Builder
		for w := range strings.SplitSeq(s, "_") {
			b.WriteString(w[:1] + strings.ToLower(w[1:]))
		}
		return b.String()
	}
	check := func(name string, value int32, want string) {
		if got, ok := consts[want]; !ok || got != int(value) {
			t.Errorf("%s (%d): codes.go has %s = %d (present: %v)", name, value, want, got, ok)
		}
	}
	for name, value := range clientpb.ErrorCode_value {
		if value != 0 {
			check(name, value, "Error"+camel(strings.TrimPrefix(name, "ERROR_CODE_")))
		}
	}
	for name, value := range clientpb.CloseCode_value {
		if value != 0 {
			check(name, value, "Close"+camel(strings.TrimPrefix(name, "CLOSE_CODE_")))
		}
	}
	if ErrorSendRateLimited != int(clientpb.ErrorCode_ERROR_CODE_SEND_RATE_LIMITED) || CloseBadToken != int(clientpb.CloseCode_CLOSE_CODE_BAD_TOKEN) {
		t.Error("the constants differ from the parsed values")
	}
}
