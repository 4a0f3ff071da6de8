package testkit

import (
	"bufio"
	"net"
	"testing"
	"time"

	"roomcast/proto/clientpb"
)

// TestClientTCP runs the client against a scripted server that speaks the TCP framing with
// ReadFrame and WriteFrame: a login, frames held back while the client is paused, then a kick.
func TestClientTCP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer nc.Close()
		f, err := ReadFrame(bufio.NewReader(nc))
		if err != nil || f.GetLogin().GetToken() != "tok" || f.GetLogin().GetDevice() != "test" {
			served <- err
			return
		}
		for _, f := range []*clientpb.Frame{
			{Kind: &clientpb.Frame_LoginAck{LoginAck: &clientpb.LoginAck{SessionId: "s1"}}},
			{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: []*clientpb.Message{{Id: "m1"}}}}},
			{Kind: &clientpb.Frame_Push{Push: &clientpb.Push{Messages: []*clientpb.Message{{Id: "m2"}, {Id: "m3"}}}}},
			{Kind: &clientpb.Frame_Kick{Kick: &clientpb.Kick{Code: uint32(clientpb.CloseCode_CLOSE_CODE_KICKED)}}},
		} {
			if err := WriteFrame(nc, f); err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()

	c := DialTCP(t, ln.Addr().String(), Paused())
	c.Send(&clientpb.Frame{Kind: &clientpb.Frame_Login{Login: &clientpb.Login{Token: "tok", Device: "test"}}})
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
	c.ExpectSilence(50 * time.Millisecond) // paused: everything waits in the socket
	c.Resume()
	if ack := c.Next().GetLoginAck(); ack.GetSessionId() != "s1" {
		t.Fatalf("want the LoginAck, got %v", ack)
	}
	if msgs, frames := c.CollectPushes(3); len(msgs) != 3 || frames != 2 || msgs[2].Id != "m3" {
		t.Fatalf("CollectPushes: %v in %d frames", msgs, frames)
	}
	c.ExpectKick(clientpb.CloseCode_CLOSE_CODE_KICKED)
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed after the connection ended")
	}
}

// TestReadFrameRefusesGarbage: bytes that are no Frame come back as an error with the frame,
// so a reader can tell them from a connection that ended.
func TestReadFrameRefusesGarbage(t *testing.T) {
	t.Parallel()
	server, client := TCPPair(t)
	if _, err := client.Write(TCPFrame([]byte{0xff, 0xff, 0xff})); err != nil {
		t.Fatal(err)
	}
	client.Close()
	r := bufio.NewReader(server)
	if f, err := ReadFrame(r); err == nil || f == nil {
		t.Fatalf("garbage read as %v, %v", f, err)
	}
	if f, err := ReadFrame(r); err == nil || f != nil {
		t.Fatalf("after the end: %v, %v", f, err)
	}
}
