package api_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/clustertest"
	"roomcast/internal/devcluster"
	"roomcast/internal/testutil"
	pb "roomcast/proto/roomcastpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startCluster starts a cluster with one ChatLink for the test.
func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	return clustertest.Start(t, clustertest.ChatLinks(1))
}

// startClusterWith starts a cluster (one ChatLink unless opts say otherwise) for the test.
func startClusterWith(t *testing.T, opts ...func(*devcluster.Config)) *devcluster.Cluster {
	t.Helper()
	return clustertest.Start(t, append([]func(*devcluster.Config){clustertest.ChatLinks(1)}, opts...)...)
}

// checkFor polls f until it returns nil or the time is up.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	testutil.CheckFor(t, total, every, f)
}

// client is a TCP client speaking the wire protocol by hand.
type client struct {
	t      *testing.T
	nc     net.Conn
	frames chan *pb.Frame
	done   chan struct{}
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &client{t: t, nc: nc, frames: make(chan *pb.Frame, 256), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.frames)
		br := bufio.NewReader(nc)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, b); err != nil {
				return
			}
			var f pb.Frame
			if err := proto.Unmarshal(b, &f); err != nil {
				t.Errorf("server sent a frame that does not parse: %v", err)
				return
			}
			c.frames <- &f
		}
	}()
	t.Cleanup(c.close)
	return c
}

func (c *client) close() { _ = c.nc.Close(); <-c.done }

func (c *client) sendFrame(f *pb.Frame) {
	c.t.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.nc.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// next returns the next frame, or nil when the connection ended; it fails the test after 5s.
func (c *client) next() *pb.Frame {
	c.t.Helper()
	select {
	case f := <-c.frames:
		return f
	case <-time.After(5 * time.Second):
		c.t.Fatal("no frame from the server in 5s")
		return nil
	}
}

// loginAs logs in and returns the first answer: a LoginAck, or a Kick.
func (c *client) loginAs(tok, device string) *pb.Frame {
	c.t.Helper()
	c.sendFrame(&pb.Frame{Kind: &pb.Frame_Login{Login: &pb.Login{Token: tok, Device: device}}})
	return c.next()
}

// expectKick waits for a Kick with code, then for the connection to end.
func (c *client) expectKick(code pb.CloseCode) {
	c.t.Helper()
	for {
		f := c.next()
		if f == nil {
			c.t.Fatalf("connection ended without a Kick %v", code)
		}
		if f.GetPush() != nil {
			continue
		}
		if f.GetKick().GetCode() != uint32(code) {
			c.t.Fatalf("want Kick %v, got %v", code, f)
		}
		break
	}
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.t.Fatal("connection not closed after the Kick")
	}
}

// member logs uid into room on the ChatLink at addr and fails unless it gets in.
func member(t *testing.T, c *devcluster.Cluster, addr, uid, room string, tags ...string) (*client, *pb.LoginAck) {
	t.Helper()
	tok, err := c.Mint(uid, room, tags, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cl := dial(t, addr)
	f := cl.loginAs(tok, "web")
	if f.GetLoginAck() == nil {
		t.Fatalf("%s: login answered with %v", uid, f)
	}
	return cl, f.GetLoginAck()
}

// httpCall calls the HTTP API and decodes the JSON answer.
func httpCall(t *testing.T, c *devcluster.Cluster, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, c.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: HTTP %d, body is not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
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
func grpcClient(t *testing.T, c *devcluster.Cluster) pb.RoomcastAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(c.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewRoomcastAPIClient(conn)
}

// withKey returns a context that carries an API key.
func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
}

func devCtx() context.Context { return withKey(devcluster.APIKey) }
