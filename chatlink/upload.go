package chatlink

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/tracing"
	"roomcast/proto/clientpb"
	"roomcast/store/roomstore"
)

// A room's members on a node send to the room service together: their sends that passed the
// node's own limits gather for a window (Config.SendWindow) and go as one request, a members'
// batch on the batch subject, that the room service checks send by send (permissions, mute,
// lane, the room's caps, the app's send callback) and answers with one answer per send. A
// room has at most one request in flight per node: sends that arrive meanwhile wait for the
// next window. So the bus and the room service see at most one message per room, node and
// window however many members send, a member's sends reach the room in the order it sent them,
// and each send gets exactly one answer (a SendAck, or an Error: the room's refusal, or 503
// when the request failed).

// DefaultSendWindow is Config.SendWindow's default: the room service's batch window, so that a
// room's way in costs the bus what its way out does, at most 50 messages a second per node.
const DefaultSendWindow = 20 * time.Millisecond

// upload is one send waiting for its room's next request, or in it.
type upload struct {
	c   *conn
	seq uint64
	req *buspb.SendRequest
}

// roomUploads are a room's sends on the node. Guarded by uploads.mu.
type roomUploads struct {
	q      []upload
	active bool // its goroutine runs (waiting for a window, or a request in flight)
}

// uploads are the node's rooms' sends waiting for the room service.
type uploads struct {
	n     *Node
	mu    sync.Mutex // guards rooms
	rooms map[roomKey]*roomUploads
}

func newUploads(n *Node) *uploads { return &uploads{n: n, rooms: map[roomKey]*roomUploads{}} }

// add queues a send of c's for its room's next request.
func (u *uploads) add(c *conn, s *clientpb.Send) {
	req := &buspb.SendRequest{
		App: c.app, Room: c.room, Uid: c.uid, SessionId: c.session,
		Type: s.Type, Lane: s.Lane, Body: s.Body, TagExpr: s.TagExpr, SenderTags: c.tagList(),
		CriticalGranted: c.critical,
	}
	k := roomKey{c.app, c.room}
	u.mu.Lock()
	r := u.rooms[k]
	if r == nil {
		r = &roomUploads{}
		u.rooms[k] = r
	}
	r.q = append(r.q, upload{c: c, seq: s.Seq, req: req})
	start := !r.active
	r.active = true
	u.mu.Unlock()
	if start {
		u.n.goAsync(func() { u.run(k, r) })
	}
}

// run carries room k's sends to the room service, a window's at a time, until none wait.
func (u *uploads) run(k roomKey, r *roomUploads) {
	n := u.n
	window := n.cfg.SendWindow
	timer := time.NewTimer(window)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-n.ctx.Done():
			u.mu.Lock()
			q := r.q
			r.q = nil
			r.active = false
			delete(u.rooms, k)
			u.mu.Unlock()
			for _, s := range q {
				s.c.write(s.answerFrame(nil, "node shutting down"))
			}
			return
		}
		began := time.Now()
		u.mu.Lock()
		take := min(len(r.q), roomstore.MaxMemberBatch)
		batch := r.q[:take:take]
		r.q = r.q[take:]
		if len(r.q) == 0 {
			r.q = nil
		}
		u.mu.Unlock()
		u.forward(batch)
		u.mu.Lock()
		if len(r.q) == 0 {
			r.active = false
			delete(u.rooms, k)
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
		// The next window counts from this one's start: a request that took longer than a
		// window lets the next go at once.
		timer.Reset(max(window-time.Since(began), 0))
	}
}

// forward asks the room service to take a window's sends of one room and answers each.
func (u *uploads) forward(batch []upload) {
	n := u.n
	ctx, span := tracing.Start(n.ctx, "chatlink send", trace.SpanKindServer)
	defer span.End() // after the answers are written
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	req := &buspb.SendBatchRequest{Sends: make([]*buspb.SendRequest, len(batch)), Members: true}
	for i, s := range batch {
		req.Sends[i] = s.req
	}
	var rep buspb.Reply
	err := n.request(ctx, busSend, bus.SubjectRoomSendBatch, req, &rep)
	// The window's answers go out together: through the node's batch writer, one system call
	// for many senders' sockets, as a room's frames do (batch.go).
	outs := make([]out, len(batch))
	for i, s := range batch {
		var a *buspb.Reply
		why := ""
		switch {
		case err != nil:
			why = "room service did not answer"
		case rep.Code != 0 || len(rep.Answers) != len(batch):
			a = &rep // the whole request refused (it does not parse, too big): every send is told
		default:
			a = rep.Answers[i]
		}
		outs[i] = out{c: s.c, fs: [][]byte{s.answerFrame(a, why)}}
	}
	n.writeOuts(outs)
}

// answerFrame frees s's place among its connection's sends in flight and returns the frame
// that answers it: rep, or 503 with why when rep is nil.
func (s upload) answerFrame(rep *buspb.Reply, why string) []byte {
	c := s.c
	c.mu.Lock()
	c.sends.waiting--
	c.mu.Unlock()
	var f *clientpb.Frame
	switch {
	case rep == nil:
		c.node.m.sendErrors.WithLabelValues(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE.String()).Inc()
		f = &clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: uint32(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE), Message: why, Seq: s.seq,
		}}}
	case rep.Code != 0:
		c.node.m.sendErrors.WithLabelValues(clientpb.ErrorCode(rep.Code).String()).Inc()
		f = &clientpb.Frame{Kind: &clientpb.Frame_Error{Error: &clientpb.Error{
			Code: rep.Code, Message: rep.Message, Seq: s.seq, RetryAfterMs: rep.RetryAfterMs,
		}}}
	default:
		f = &clientpb.Frame{Kind: &clientpb.Frame_SendAck{SendAck: &clientpb.SendAck{
			Seq: s.seq, MessageId: rep.MessageId, ServerTimeMs: rep.ServerTimeMs,
		}}}
	}
	b, _ := proto.Marshal(f) // a frame of our own making always encodes
	return b
}
