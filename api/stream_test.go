package api_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"roomcast/api"
	"roomcast/internal/auth"
	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

// TestSendStream: many sends on one SendStream reach the room's member in the order sent,
// each answered once with its seq and the id the member sees; a send refused is answered with
// its code and the stream goes on; a bad key ends the stream; over the key's call rate each
// send is refused with API_RATE_LIMITED and when to try again.
func TestSendStream(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"s1","settings":{"normal_budget":-1}}`) // no normal message thinned
	cl, _ := member(t, c.Nodes[0].TCPAddr(), "viewer", "s1")
	g := grpcClient(t, c)

	stream, err := g.SendStream(devCtx())
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		lane := "critical"
		if i%3 == 1 {
			lane = "normal" // answered at once; its neighbours wait for their window
		}
		if err := stream.Send(&apipb.StreamSendRequest{Seq: uint64(1000 + i), Send: &apipb.SendToRoomRequest{
			Room: "s1", Type: "notice", Lane: lane, Body: strconv.Itoa(i),
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// Refused sends, between good ones: each answered with its code, the stream goes on.
	refused := map[uint64]clientpb.ErrorCode{
		1: clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, // a room name that is not one
		2: clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, // no send
		3: clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, // a lane that is not one
	}
	for _, r := range []*apipb.StreamSendRequest{
		{Seq: 1, Send: &apipb.SendToRoomRequest{Room: "no room!", Body: "x"}},
		{Seq: 2},
		{Seq: 3, Send: &apipb.SendToRoomRequest{Room: "s1", Lane: "loud", Body: "x"}},
		{Seq: 4, Send: &apipb.SendToRoomRequest{Room: "s1", Type: "notice", Lane: "critical", Body: strconv.Itoa(n)}},
	} {
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	ids := map[uint64]string{}
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d answers: %v", len(ids), err)
		}
		if _, again := ids[r.Seq]; again {
			t.Fatalf("send %d answered twice", r.Seq)
		}
		ids[r.Seq] = r.Id
		want, isRefused := refused[r.Seq]
		switch {
		case isRefused && (r.Code != want || r.Error == "" || r.Id != ""):
			t.Errorf("send %d: %v, want refused with %v", r.Seq, r, want)
		case !isRefused && (r.Code != 0 || r.Id == "" || r.ServerTimeMs == 0):
			t.Errorf("send %d: %v, want accepted", r.Seq, r)
		}
	}
	if len(ids) != n+4 {
		t.Fatalf("%d answers, want %d", len(ids), n+4)
	}
	msgs, _ := cl.CollectPushes(n + 1)
	for i, m := range msgs {
		seq := uint64(1000 + i)
		if i == n {
			seq = 4
		}
		if string(m.Body) != strconv.Itoa(i) || m.Id != ids[seq] {
			t.Fatalf("message %d the member got: body %q id %s, want body %q id %s (in the order sent)", i, m.Body, m.Id, strconv.Itoa(i), ids[seq])
		}
	}

	// A bad key: the stream ends, nothing is sent.
	bad, err := g.SendStream(withKey("no-such-key"))
	if err == nil {
		_ = bad.Send(&apipb.StreamSendRequest{Seq: 1, Send: &apipb.SendToRoomRequest{Room: "s1", Body: "x"}})
		_, err = bad.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a stream with an unknown key: %v, want Unauthenticated", err)
	}
	// Counted as a refused call is, and each send as a call.
	if n := testkit.MetricValue(t, c.URL()+"/metrics", `roomcast_api_requests_total{code="UNAUTHORIZED",method="SendStream",transport="grpc"}`); n != 1 {
		t.Errorf("refused stream opens counted: %v, want 1", n)
	}
	if got := testkit.MetricValue(t, c.URL()+"/metrics", `roomcast_api_requests_total{code="OK",method="SendStream",transport="grpc"}`); got != n+1 {
		t.Errorf("accepted sends counted: %v, want %d", got, n+1)
	}
	cl.ExpectSilence(200 * time.Millisecond)

	// Over the key's call rate, each send counts as a call.
	mustHTTP(t, c, 200, "PUT", "/v1/limits", `{"api_calls_per_key": "1/m:2"}`)
	testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if status, out := httpCall(t, c, "GET", "/v1/online", devcluster.APIKey, ""); status != http.StatusTooManyRequests {
			return fmt.Errorf("call after the change: HTTP %d %v", status, out)
		}
		return nil
	})
	limited, err := g.SendStream(devCtx())
	if err != nil {
		t.Fatal(err)
	}
	if err := limited.Send(&apipb.StreamSendRequest{Seq: 7, Send: &apipb.SendToRoomRequest{Room: "s1", Body: "x"}}); err != nil {
		t.Fatal(err)
	}
	r, err := limited.Recv()
	if err != nil || r.Seq != 7 || r.Code != clientpb.ErrorCode_ERROR_CODE_API_RATE_LIMITED || r.RetryAfterMs == 0 {
		t.Fatalf("a send over the call rate: %v %v, want API_RATE_LIMITED with retry_after_ms", r, err)
	}
	_ = limited.CloseSend()
	if _, err := limited.Recv(); err != io.EOF {
		t.Fatalf("the stream after its last answer: %v, want its end", err)
	}
}

// TestSendStreamOverNATS: a server API without a room service of its own (as a services process
// whose room service has not started) makes a stream's sends over NATS, concurrently: each is
// answered once, with the id the member sees, and every one reaches the member.
func TestSendStreamOverNATS(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.ChatLinks(1))
	mustHTTP(t, c, 201, "POST", "/v1/rooms", `{"room":"s2","settings":{"normal_budget":-1}}`)
	cl, _ := member(t, c.Nodes[0].TCPAddr(), "viewer", "s2")
	nc, err := nats.Connect(c.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	a, err := api.New(api.Config{Bus: nc, Keys: auth.APIKeys{"k": {App: "demo"}}}) // no Rooms: every send goes over NATS
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := a.NewGRPCServer()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	stream, err := apipb.NewRoomcastAPIClient(conn).SendStream(withKey("k"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	for i := range n {
		lane := []string{"critical", "normal", "bulk"}[i%3]
		if err := stream.Send(&apipb.StreamSendRequest{Seq: uint64(i + 1), Send: &apipb.SendToRoomRequest{Room: "s2", Lane: lane, Body: strconv.Itoa(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{} // message id -> body
	answered := map[uint64]bool{}
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %d answers: %v", len(answered), err)
		}
		if answered[r.Seq] || r.Code != 0 || r.Id == "" {
			t.Fatalf("answer %v (answered before: %v)", r, answered[r.Seq])
		}
		answered[r.Seq] = true
		ids[r.Id] = strconv.Itoa(int(r.Seq - 1))
	}
	if len(answered) != n {
		t.Fatalf("%d answers, want %d", len(answered), n)
	}
	msgs, _ := cl.CollectPushes(n)
	for _, m := range msgs {
		if body, ok := ids[m.Id]; !ok || body != string(m.Body) {
			t.Fatalf("the member got %s (%q), which no answer named with that body", m.Id, m.Body)
		}
		delete(ids, m.Id)
	}
}
