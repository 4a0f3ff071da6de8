package api_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"roomcast/internal/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	pb "roomcast/proto/roomcastpb"
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
		if err := stream.Send(&pb.StreamSendRequest{Seq: uint64(1000 + i), Send: &pb.SendToRoomRequest{
			Room: "s1", Type: "notice", Lane: lane, Body: strconv.Itoa(i),
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// Refused sends, between good ones: each answered with its code, the stream goes on.
	refused := map[uint64]pb.ErrorCode{
		1: pb.ErrorCode_ERROR_CODE_BAD_REQUEST, // a room name that is not one
		2: pb.ErrorCode_ERROR_CODE_BAD_REQUEST, // no send
		3: pb.ErrorCode_ERROR_CODE_BAD_REQUEST, // a lane that is not one
	}
	for _, r := range []*pb.StreamSendRequest{
		{Seq: 1, Send: &pb.SendToRoomRequest{Room: "no room!", Body: "x"}},
		{Seq: 2},
		{Seq: 3, Send: &pb.SendToRoomRequest{Room: "s1", Lane: "loud", Body: "x"}},
		{Seq: 4, Send: &pb.SendToRoomRequest{Room: "s1", Type: "notice", Lane: "critical", Body: strconv.Itoa(n)}},
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
		_ = bad.Send(&pb.StreamSendRequest{Seq: 1, Send: &pb.SendToRoomRequest{Room: "s1", Body: "x"}})
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
	if err := limited.Send(&pb.StreamSendRequest{Seq: 7, Send: &pb.SendToRoomRequest{Room: "s1", Body: "x"}}); err != nil {
		t.Fatal(err)
	}
	r, err := limited.Recv()
	if err != nil || r.Seq != 7 || r.Code != pb.ErrorCode_ERROR_CODE_API_RATE_LIMITED || r.RetryAfterMs == 0 {
		t.Fatalf("a send over the call rate: %v %v, want API_RATE_LIMITED with retry_after_ms", r, err)
	}
	_ = limited.CloseSend()
	if _, err := limited.Recv(); err != io.EOF {
		t.Fatalf("the stream after its last answer: %v, want its end", err)
	}
}
