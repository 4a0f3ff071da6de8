package callback

import (
	"encoding/json"
	"testing"

	"roomcast/tag"
)

// FuzzAnswer feeds a hook's answer body to the checks an answer passes before a decision
// follows it: whatever the body, an answer they accept carries allow and only what its hook
// may change, within bounds.
func FuzzAnswer(f *testing.F) {
	for _, s := range []string{
		`{"allow":true}`, `{"allow":false,"reason":"no"}`, `{"allow":true,"tags":["vip","lang:en"]}`,
		`{"allow":true,"tags":[]}`, `{"allow":true,"body":"KioqKg==","type":"censored"}`,
		`{"allow":true,"body":""}`, `{"allow":true,"lane":2}`, `{"allow":true,"lane":0}`, `{"reason":"x"}`, `<html>`, `null`, `{"allow":null}`,
	} {
		f.Add(s)
	}
	c := &Client{cfg: Config{MaxBodyBytes: 16 << 10, MaxTypeBytes: 32}}
	f.Fuzz(func(t *testing.T, body string) {
		for _, hook := range []Hook{HookLogin, HookSend} {
			e := &endpoint{c: c, hook: hook}
			var a Answer
			if json.Unmarshal([]byte(body), &a) != nil || e.check(&a, 2) != nil { // a normal send's answer
				continue
			}
			switch {
			case a.Allow == nil:
				t.Fatalf("%s: accepted without allow: %q", hook, body)
			case hook == HookLogin && (a.Body != nil || a.Type != nil || a.Lane != nil):
				t.Fatalf("login answer with a rewrite accepted: %q", body)
			case hook == HookSend && a.Tags != nil:
				t.Fatalf("send answer with tags accepted: %q", body)
			case a.Body != nil && (len(a.Body) == 0 || len(a.Body) > 16<<10):
				t.Fatalf("rewritten body of %d bytes accepted", len(a.Body))
			case a.Lane != nil && *a.Lane != 2 && *a.Lane != 3:
				t.Fatalf("lane %d accepted for a normal message", *a.Lane)
			case a.Type != nil && len(*a.Type) > 32:
				t.Fatalf("rewritten type of %d bytes accepted", len(*a.Type))
			case a.Tags != nil && tag.Validate(*a.Tags) != nil:
				t.Fatalf("bad tags accepted: %q", *a.Tags)
			}
		}
	})
}
