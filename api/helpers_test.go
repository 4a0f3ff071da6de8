package api_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"roomcast/internal/roles/devcluster"
	"roomcast/internal/testkit"
	"roomcast/internal/testkit/testcluster"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// member logs uid into room on the ChatLink at addr and fails unless it gets in.
func member(t *testing.T, addr, uid, room string, tags ...string) (*testkit.Client, *clientpb.LoginAck) {
	t.Helper()
	cl := testkit.DialTCP(t, addr)
	f := cl.LoginAs(testcluster.Token(t, uid, room, tags...), "web")
	if f.GetLoginAck() == nil {
		t.Fatalf("%s: login answered with %v", uid, f)
	}
	return cl, f.GetLoginAck()
}

// httpCall calls the HTTP API and decodes the JSON answer.
func httpCall(t *testing.T, c *devcluster.Cluster, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	var out map[string]any
	code := testcluster.Call(t, c, method, path, key, body, &out)
	return code, out
}

// mustHTTP calls the HTTP API and fails unless the status is want.
func mustHTTP(t *testing.T, c *devcluster.Cluster, want int, method, path, body string) map[string]any {
	t.Helper()
	status, out := httpCall(t, c, method, path, devcluster.APIKey, body)
	if status != want {
		t.Fatalf("%s %s: HTTP %d %v, want %d", method, path, status, out, want)
	}
	return out
}

// grpcClient dials the cluster's gRPC API.
func grpcClient(t *testing.T, c *devcluster.Cluster) apipb.RoomcastAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(c.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return apipb.NewRoomcastAPIClient(conn)
}

// withKey returns a context that carries an API key.
func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

func devCtx() context.Context { return withKey(devcluster.APIKey) }

// expectRefused fails the test unless cl's login with tok ends in a Kick with code: at once, or
// right after its LoginAck when the node learned of the ban or the room's close while the login
// was on its way (a node's cache may lag the API's call by a moment; chatlink's refusedLate
// closes such a login as it goes live).
func expectRefused(t *testing.T, cl *testkit.Client, tok string, code clientpb.CloseCode, what string) {
	t.Helper()
	f := cl.LoginAs(tok, "web")
	if f.GetLoginAck() != nil {
		cl.ExpectKickAfterPushes(code)
		return
	}
	if f.GetKick().GetCode() != uint32(code) {
		t.Fatalf("%s answered with %v, want Kick %v", what, f, code)
	}
}
