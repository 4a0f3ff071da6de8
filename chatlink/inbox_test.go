package chatlink_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/clientpb"
	"roomcast/store/inbox"
)

// sendToUser sends an at-least-once message to uid through the server API's HTTP endpoint and
// returns the HTTP status and the answer.
func sendToUser(t *testing.T, c *devcluster.Cluster, uid, body string, expirySeconds int) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"uids": []string{uid}, "type": "notice", "body": body, "at_least_once": true, "expiry_seconds": expirySeconds})
	req, _ := http.NewRequest(http.MethodPost, c.URL()+"/v1/users/messages", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+devcluster.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("answer %q: %v", data, err)
	}
	return resp.StatusCode, out
}

// inboxLogin connects to the cluster's first ChatLink and logs uid in, asking for its stored
// messages (Login.inbox) when inbox is set.
func inboxLogin(t *testing.T, c *devcluster.Cluster, uid string, inbox bool) *testkit.Client {
	t.Helper()
	cl := testkit.DialWS(t, c.Nodes[0].WSURL())
	cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, uid, "lobby"), Inbox: inbox}}})
	if f := cl.Next(); f.GetLoginAck() == nil {
		t.Fatalf("login answered with %v", f)
	}
	return cl
}

func ackFrame(ids ...string) *clientpb.Frame {
	return &clientpb.Frame{Kind: &clientpb.Frame_Ack{Ack: &clientpb.Ack{Ids: ids}}}
}

// TestInboxUnackedComesAgain: an at-least-once message reaches the online session at once,
// marked; the client drops without acknowledging it, and the next login gets it again. Another
// user's Ack does not remove it, a login that does not ask for the inbox does not get it, and
// once acknowledged no login gets it.
func TestInboxUnackedComesAgain(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))

	bob := inboxLogin(t, c, "bob", true)
	testcluster.WaitOnline(t, c, "bob")
	status, rep := sendToUser(t, c, "bob", "hello", 0)
	if status != http.StatusOK || rep["sessions"] != float64(1) {
		t.Fatalf("send: %d %v", status, rep)
	}
	live := bob.Next().GetPush().GetMessages()
	if len(live) != 1 || !live[0].AtLeastOnce || string(live[0].Body) != "hello" || live[0].ExpiresMs <= live[0].ServerTimeMs {
		t.Fatalf("live delivery: %v", live)
	}
	id := live[0].Id
	bob.Close() // no Ack

	carol := inboxLogin(t, c, "carol", true)
	carol.Send(ackFrame(id)) // not carol's: ignored
	plain := inboxLogin(t, c, "bob", false)
	plain.ExpectSilence(300 * time.Millisecond)

	bob = inboxLogin(t, c, "bob", true)
	again := bob.Next().GetPush().GetMessages()
	if len(again) != 1 || again[0].Id != id || !again[0].AtLeastOnce {
		t.Fatalf("at the next login: %v, want %s again", again, id)
	}
	bob.Send(ackFrame(id))
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if ids := testcluster.Stored(t, c, "bob"); len(ids) > 0 {
			return fmt.Errorf("still stored after the Ack: %v", ids)
		}
		return nil
	})
	bob.Close()
	bob = inboxLogin(t, c, "bob", true)
	bob.ExpectSilence(300 * time.Millisecond)
}

// TestInboxLimits: the per-user limit refuses a send (INBOX_FULL) without dropping what is
// stored, an expiry over the maximum is refused, a message past its expiry is no longer
// delivered, and a malformed Ack closes the connection.
func TestInboxLimits(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1), func(cfg *devcluster.Config) {
		cfg.API.Inbox.MaxPerUser, cfg.API.Inbox.Expiry, cfg.API.Inbox.MaxExpiry = 2, time.Minute, time.Hour
	})
	for i := range 2 {
		if status, rep := sendToUser(t, c, "dave", fmt.Sprint(i), 0); status != http.StatusOK {
			t.Fatalf("send %d: %d %v", i, status, rep)
		}
	}
	if status, rep := sendToUser(t, c, "dave", "one too many", 0); status != http.StatusTooManyRequests || rep["code"] != float64(clientpb.ErrorCode_ERROR_CODE_INBOX_FULL) {
		t.Fatalf("third send: %d %v, want 429 with code 112", status, rep)
	}
	if n := len(testcluster.Stored(t, c, "dave")); n != 2 {
		t.Fatalf("%d stored, want the first 2", n)
	}
	if status, rep := sendToUser(t, c, "dave", "too long", 7200); status != http.StatusBadRequest {
		t.Fatalf("expiry over the maximum: %d %v, want 400", status, rep)
	}

	if status, rep := sendToUser(t, c, "erin", "short-lived", 1); status != http.StatusOK {
		t.Fatalf("send: %d %v", status, rep)
	}
	if n := len(testcluster.Stored(t, c, "erin")); n != 1 {
		t.Fatalf("%d stored, want 1", n)
	}
	testkit.CheckFor(t, 5*time.Second, 100*time.Millisecond, func() error {
		if ids := testcluster.Stored(t, c, "erin"); len(ids) > 0 {
			return fmt.Errorf("still stored past its expiry: %v", ids)
		}
		return nil
	})
	erin := inboxLogin(t, c, "erin", true)
	erin.ExpectSilence(300 * time.Millisecond)

	erin.Send(ackFrame("not-a-message-id"))
	erin.ExpectKick(clientpb.CloseCode_CLOSE_CODE_BAD_FRAME)
}

// TestInboxReadsShared: logins at the same moment share the reads of their stored messages
// (one request asks which users have any), and the one user with a stored message still gets
// it, once, while the others get nothing.
func TestInboxReadsShared(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	if status, rep := sendToUser(t, c, "frank", "kept", 0); status != http.StatusOK {
		t.Fatalf("send: %d %v", status, rep)
	}
	nc, err := nats.Connect(c.NATSURL(), nats.InProcessServer(c.NATS))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var reads atomic.Int64 // the stream's direct gets: a copy of each request reaches this subscription
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET."+inbox.Stream+".>", func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	sub2, err := nc.Subscribe("$JS.API.DIRECT.GET."+inbox.Stream, func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const logins = 20
	clients := make([]*testkit.Client, logins)
	for i := range clients {
		clients[i] = testkit.DialWS(t, c.Nodes[0].WSURL())
	}
	for i, cl := range clients { // the Logins go out together, so that their reads can be shared
		uid := fmt.Sprintf("quiet-%d", i)
		if i == 0 {
			uid = "frank"
		}
		cl.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: testcluster.Token(t, uid, "lobby"), Inbox: true}}})
	}
	for _, cl := range clients {
		if f := cl.Next(); f.GetLoginAck() == nil {
			t.Fatalf("login answered with %v", f)
		}
	}
	if got := clients[0].Next().GetPush().GetMessages(); len(got) != 1 || string(got[0].Body) != "kept" {
		t.Fatalf("frank's stored message: %v", got)
	}
	clients[0].ExpectSilence(1200 * time.Millisecond) // past the second reads (inboxRecheck)
	for _, cl := range clients[1:] {
		cl.ExpectSilence(10 * time.Millisecond)
	}
	// Read alone, the 20 logins would cost 40 requests: a first and a second read each.
	if n := reads.Load(); n > logins/2 {
		t.Fatalf("%d reads of the stored messages for %d logins, want them shared", n, logins)
	}
	t.Logf("%d reads of the stored messages for %d logins", reads.Load(), logins)
}
