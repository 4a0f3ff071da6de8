package auth

import (
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
	"time"
)

// plainSeeds are claims sets of the plain shape and just outside it.
var plainSeeds = []string{
	`{"app":"demo","uid":"u1","room":"r1","tags":["class:3","role:student"],"sub":"u1","exp":1767225600,"iat":1767222000}`,
	`{"app":"demo","uid":"u1","room":"r1","lanes":["critical"],"exp":1767225600}`, `{"lanes":[]}`, `{"lanes":"critical"}`,
	`{ "app" : "a" , "uid":"u", "room":"r", "tags":[ ], "exp": 1.5e9, "nbf":0, "aud":["x","y"], "n": -0.25E+2 }`,
	`{}`, ` {} `, `{"tags":[]}`, `{"tags":null}`, `{"app":null}`, `{"app":"\u0061"}`, `{"app":"é"}`,
	`{"exp":01}`, `{"exp":1.}`, `{"exp":1e}`, `{"exp":-1}`, `{"exp":1e300}`, `{"exp":"1"}`, `{"exp":1x}`,
	`{"app":"a","app":"b"}`, `{"APP":"a"}`, `{"tagſ":[]}`, `{"x":{"a":1}}`, `{"x":true}`, `{"x":1,}`,
	`{"app":"a"}x`, `{"app":"a"`, `{"tags":["a",]}`, `{"tags":["a" "b"]}`, `[]`, ``, `{"a":"b\"}`,
}

// FuzzDecodePlain checks that decodePlain, the fast path of Verify, accepts nothing that
// decodeObject (encoding/json, exact names) refuses and decodes nothing differently.
func FuzzDecodePlain(f *testing.F) {
	for _, s := range plainSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast wireClaims
		if !fast.decodePlain(body) {
			return
		}
		var slow wireClaims
		if err := slow.decode(body); err != nil {
			t.Fatalf("decodePlain took %q, which decodeObject refuses: %v", body, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: decodePlain %+v, decodeObject %+v", body, fast, slow)
		}
	})
}

// TestDecodePlainTakesMinted checks that the tokens Mint writes take the fast path, and that
// what lies outside the plain shape is left to decodeObject.
func TestDecodePlainTakesMinted(t *testing.T) {
	t.Parallel()
	tok, err := Mint([]byte("s"), "demo", "user-1", "room-1", []string{"class:3", "role:student"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	body, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	var w wireClaims
	if !w.decodePlain(body) || w.App != "demo" || w.Room != "room-1" || len(w.Tags) != 2 || !w.Exp.set {
		t.Errorf("minted claims %s: fast path %v, %+v", body, w.decodePlain(body), w)
	}
	for _, s := range []string{`{"app":"\u0061"}`, `{"app":null}`, `{"app":"a","app":"b"}`, `{"APP":"a"}`, `{"exp":1e300}`, `{"x":true}`} {
		if (&wireClaims{}).decodePlain([]byte(s)) {
			t.Errorf("decodePlain took %s", s)
		}
	}
}
