package api

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"roomcast/proto/apipb"
)

// sendBodies are bodies of a send to a room: the plain shape the fast path takes, and the
// others it must leave to protojson.
var sendBodies = []struct {
	body  string
	plain bool // decodeSendToRoom takes it
}{
	{`{"type":"bench","lane":"critical","body_base64":"AAECAwQFBgc=","tag_expr":"\"vip\" in tags"}`, true}, // a targeted send
	{`{"body":"a\\b\/c\n\t\r\b\f\"d\""}`, true},                                                            // every escape but \u
	{`{"body":"\\"}`, true},
	{`{"body":"x\q"}`, false},          // not an escape: protojson refuses it
	{`{"body":"x\`, false},             // cut short in an escape
	{"{\"body\":\"\xe2\\\"\"}", false}, // invalid UTF-8 before an escape
	{`{"ty\/pe":"x"}`, false},          // an escaped name: unknown once unescaped
	{`{"type":"bench","lane":"critical","body_base64":"AAECAwQFBgc="}`, true},
	{`{"body":"hello","lane":"normal"}`, true},
	{` { "body" : "héllo 😀" , "sender" : "alice", "tag_expr": "vip" } `, true},
	{"{\n\t\"body\":\"x\"\r\n}", true},
	{`{}`, true},
	{`{"body_base64":"AAECAwQ"}`, true},    // unpadded: protojson takes it too
	{`{"body_base64":"-_-_"}`, true},       // the URL alphabet
	{`{"body_base64":"AA=A"}`, false},      // not base64: protojson refuses it
	{`{"body":"a","body":"b"}`, false},     // twice
	{`{"bodyBase64":"AAEC"}`, false},       // the JSON name
	{`{"room":"other","body":"x"}`, false}, // the path names the room
	{`{"body":"x","extra":"y"}`, false},    // unknown
	{`{"body":null}`, false},               // null
	{`{"body":"x"} {}`, false},             // trailing data
	{`{"body":"x",}`, false},               // trailing comma
	{`{"body":"\u0041"}`, false},           // an escape
	{"{\"body\":\"\xff\"}", false},         // invalid UTF-8
	{"{\"body\":\"a\tb\"}", false},         // a control character
	{`{"body":"x"`, false},                 // cut short
	{`{"type":2}`, false},                  // a number
	{`[]`, false},                          // not an object
}

func TestDecodeSendToRoomTakesThePlainShape(t *testing.T) {
	t.Parallel()
	for _, tc := range sendBodies {
		var fast apipb.SendToRoomRequest
		if got := decodeSendToRoom([]byte(tc.body), &fast); got != tc.plain {
			t.Errorf("%s: fast path took it %v, want %v", tc.body, got, tc.plain)
			continue
		}
		if !tc.plain {
			if !proto.Equal(&fast, &apipb.SendToRoomRequest{}) {
				t.Errorf("%s: refused but changed the request: %v", tc.body, &fast)
			}
			continue
		}
		var slow apipb.SendToRoomRequest
		if err := protojson.Unmarshal([]byte(tc.body), &slow); err != nil {
			t.Errorf("%s: taken, but protojson refuses it: %v", tc.body, err)
			continue
		}
		if !proto.Equal(&fast, &slow) {
			t.Errorf("%s: fast %v, protojson %v", tc.body, &fast, &slow)
		}
	}
}

// Whatever the fast path takes, protojson decodes to the same request.
func FuzzDecodeSendToRoom(f *testing.F) {
	for _, tc := range sendBodies {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast apipb.SendToRoomRequest
		if !decodeSendToRoom(body, &fast) {
			return
		}
		var slow apipb.SendToRoomRequest
		if err := protojson.Unmarshal(body, &slow); err != nil {
			t.Fatalf("%q: taken, but protojson refuses it: %v", body, err)
		}
		if !proto.Equal(&fast, &slow) {
			t.Fatalf("%q: fast %v, protojson %v", body, &fast, &slow)
		}
	})
}

// go test -run '^$' -bench DecodeSendToRoom -benchmem ./api/
func BenchmarkDecodeSendToRoom(b *testing.B) {
	const payload = `"type":"bench","lane":"critical","body_base64":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+Pw=="`
	for _, bc := range []struct{ name, body string }{
		{"broadcast", `{` + payload + `}`},
		{"targeted", `{` + payload + `,"tag_expr":"\"c:3\" in tags || \"g:17\" in tags"}`}, // as bench fanout --tags sends
	} {
		body := []byte(bc.body)
		b.Run(bc.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				var req apipb.SendToRoomRequest
				if !decodeSendToRoom(body, &req) {
					b.Fatal("not taken")
				}
			}
		})
		b.Run(bc.name+"/protojson", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				var req apipb.SendToRoomRequest
				if err := protojson.Unmarshal(body, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
