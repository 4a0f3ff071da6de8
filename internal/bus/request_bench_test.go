package bus

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"roomcast/internal/buspb"
	"roomcast/internal/roles/devnats"
)

// BenchmarkRequest is one request/reply round trip over an embedded NATS server as the way in
// makes it (a ChatLink's or the API's send to the room service), with tracing off: what tracing
// must not make dearer while it is off.
func BenchmarkRequest(b *testing.B) {
	ns, err := devnats.Start(devnats.Config{StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL(), nats.InProcessServer(ns))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	rep := &buspb.Reply{MessageId: "01KB0000000000000000000000"}
	if _, err := nc.Subscribe(SubjectRoomSend, func(m *nats.Msg) { Respond(nil, m, rep) }); err != nil {
		b.Fatal(err)
	}
	req := &buspb.SendRequest{App: "demo", Room: "r1", Uid: "alice", SessionId: "s1", Body: []byte("hello")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		var got buspb.Reply
		if err := Request(ctx, nc, SubjectRoomSend, req, &got); err != nil {
			b.Fatal(err)
		}
	}
}
