package chatlink_test

import (
	"fmt"
	"testing"
	"time"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
)

// historyAnswer logs in with login and reads the answer to its history request: the messages
// of the Pushes marked history, then the Recovery that ends them, or an Error with seq 0.
func historyAnswer(t *testing.T, c *devcluster.Cluster, uid string, login *clientpb.Login) (msgs []*clientpb.Message, rec *clientpb.Recovery, e *clientpb.Error) {
	t.Helper()
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	defer cl.Close()
	login.Token = testcluster.Token(t, uid, "rec")
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: login}})
	if ack := cl.Next().GetLoginAck(); ack == nil || ack.ProtocolVersion != 1 {
		t.Fatalf("LoginAck %v, want one with protocol_version 1", ack)
	}
	for {
		f := cl.Next()
		if e := f.GetError(); e != nil {
			return msgs, nil, e
		}
		if !f.GetPush().GetHistory() {
			t.Fatalf("want a history Push or an Error, got %v", f)
		}
		msgs = append(msgs, f.GetPush().Messages...)
		if rec := f.GetPush().GetRecovery(); rec != nil {
			return msgs, rec, nil
		}
	}
}

// TestRecoverySaysWhatItDid: with 5 messages kept per room and 8 sent, a login recovering since
// the first learns that 2 are gone; since the 4th, that it got everything; since the last, that
// there was nothing to recover; with a recover_since that is not an id, an Error 109.
func TestRecoverySaysWhatItDid(t *testing.T) {
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) { cfg.Room.HistoryPerRoom = 5 })
	watcher := testkit.DialWS(t, c.Nodes[0].WSURL())
	watcher.Login(testcluster.Token(t, "watcher", "rec"))
	for i := 1; i <= 8; i++ {
		apiSend(t, c, "rec", fmt.Sprintf(`{"body":"%d","lane":"critical"}`, i))
	}
	sent, _ := watcher.CollectPushes(8)
	for i, m := range sent {
		if m.RoomSeq != uint64(i+1) || string(m.Body) != fmt.Sprint(i+1) {
			t.Fatalf("message %d: room_seq %d, body %q; want %d", i, m.RoomSeq, m.Body, i+1)
		}
	}
	since := func(i int) *clientpb.Login {
		return &clientpb.Login{RecoverSince: sent[i].Id, RecoverSinceRoomSeq: sent[i].RoomSeq}
	}
	bodies := func(msgs []*clientpb.Message) string {
		var b []string
		for _, m := range msgs {
			b = append(b, string(m.Body))
		}
		return fmt.Sprint(b)
	}

	// History is written asynchronously: wait until the last message is kept.
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		msgs, rec, _ := historyAnswer(t, c, "a", since(3))
		if got := bodies(msgs); got != "[5 6 7 8]" || !rec.GetRecovered() || rec.GetMissing() != 0 {
			return fmt.Errorf("since the 4th: %s, %v; want [5 6 7 8], recovered", got, rec)
		}
		return nil
	})
	if msgs, rec, _ := historyAnswer(t, c, "b", since(0)); bodies(msgs) != "[4 5 6 7 8]" || rec.GetRecovered() || rec.GetMissing() != 2 {
		t.Errorf("since the 1st: %s, %v; want [4 5 6 7 8], not recovered, 2 missing", bodies(msgs), rec)
	}
	if msgs, rec, _ := historyAnswer(t, c, "c", since(7)); len(msgs) != 0 || !rec.GetRecovered() {
		t.Errorf("since the last: %s, %v; want nothing, recovered", bodies(msgs), rec)
	}
	if msgs, rec, _ := historyAnswer(t, c, "d", &clientpb.Login{History: 3}); bodies(msgs) != "[6 7 8]" || !rec.GetRecovered() {
		t.Errorf("the last 3: %s, %v; want [6 7 8], recovered", bodies(msgs), rec)
	}
	if _, _, e := historyAnswer(t, c, "e", &clientpb.Login{RecoverSince: "yesterday"}); e.GetCode() != uint32(clientpb.ErrorCode_ERROR_CODE_BAD_RECOVER_SINCE) || e.GetSeq() != 0 {
		t.Errorf("recover_since that is not an id: %v, want Error 109 with seq 0", e)
	}

	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, "f", "rec"), ProtocolVersion: 2}}})
	cl.ExpectKick(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME)
}
