package api

import (
	"encoding/json"
	"testing"

	"roomcast/proto/apipb"
)

// A send's answer takes a shortcut past jsonMessage; its JSON must be the same bytes.
func TestSendAnswerJSONIsTheMessageJSON(t *testing.T) {
	t.Parallel()
	for _, resp := range []*apipb.SendResponse{
		{Id: "01KBDQ4F3T0000000000000000", ServerTimeMs: 1764625000123},
		{},                              // zero values are still written
		{Id: `<"&>\`, ServerTimeMs: -1}, // escaped alike
	} {
		fast, err := json.Marshal(answerJSON(resp))
		if err != nil {
			t.Fatal(err)
		}
		slow, err := json.Marshal(jsonMessage(resp.ProtoReflect()))
		if err != nil {
			t.Fatal(err)
		}
		if string(fast) != string(slow) {
			t.Errorf("answer %v: shortcut writes %s, jsonMessage %s", resp, fast, slow)
		}
	}
}
