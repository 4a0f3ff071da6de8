package api

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/roomstore"
)

// Sends: to a room, a batch to a room, to users' sessions wherever they are, to one session,
// and a notice to every room of the app.

// message checks the parts of a message common to sends to a room and to users.
func message(typ, laneName, text string, binary []byte, sender string) (clientpb.Lane, []byte, error) {
	lane, ok := ParseLane(laneName)
	switch {
	case !ok:
		return 0, nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "lane %q is not critical, normal or bulk", laneName)
	case text != "" && len(binary) > 0:
		return 0, nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "set body or body_base64, not both")
	case sender != "" && !auth.ValidName(sender):
		return 0, nil, badName("sender", sender)
	}
	body := binary
	if text != "" {
		body = []byte(text)
	}
	if rep := roomstore.CheckSend(&buspb.SendRequest{App: "-", Room: "-", Type: typ, Lane: lane, Body: body}); rep != nil {
		return 0, nil, apiError(clientpb.ErrorCode(rep.Code), "%s", rep.Message)
	}
	return lane, body, nil
}

// ParseLane maps a lane name to its Lane; "" is normal.
func ParseLane(s string) (clientpb.Lane, bool) {
	switch strings.ToLower(s) {
	case "", "normal":
		return clientpb.Lane_LANE_NORMAL, true
	case "critical":
		return clientpb.Lane_LANE_CRITICAL, true
	case "bulk":
		return clientpb.Lane_LANE_BULK, true
	}
	return 0, false
}

// SendToRoom implements RoomcastAPI.
func (a *API) SendToRoom(ctx context.Context, req *apipb.SendToRoomRequest) (*apipb.SendResponse, error) {
	return a.queueSendToRoom(ctx, req).wait()
}

// queuedSend is a send queueSendToRoom handed on: wait gives its outcome, and must be called
// once.
type queuedSend struct {
	wait func() (*apipb.SendResponse, error)
	// waits: wait blocks, for the room's window (a critical send) or for a request over NATS
	// (remote). Otherwise the outcome is known and wait returns at once.
	waits, remote bool
}

// queueSendToRoom checks req and hands it to the room service. A send the room service of this
// process takes reaches it before queueSendToRoom returns, so sends queued one after the other
// keep their order; a send that goes over NATS (remote) is made when wait is called.
func (a *API) queueSendToRoom(ctx context.Context, req *apipb.SendToRoomRequest) queuedSend {
	failed := func(err error) queuedSend {
		return queuedSend{wait: func() (*apipb.SendResponse, error) { return nil, err }}
	}
	if !auth.ValidName(req.Room) {
		return failed(badName("room", req.Room))
	}
	lane, body, err := message(req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender)
	if err != nil {
		return failed(err)
	}
	// message checked type, lane and body; the room service checks the tag expression.
	send := &buspb.SendRequest{App: appOf(ctx), Room: req.Room, Uid: req.Sender, Type: req.Type, Lane: lane, Body: body, TagExpr: req.TagExpr}
	answered := func(rep *buspb.Reply, err error) (*apipb.SendResponse, error) {
		if err != nil {
			return nil, err
		}
		return &apipb.SendResponse{Id: rep.MessageId, ServerTimeMs: rep.ServerTimeMs}, nil
	}
	if a.cfg.Rooms != nil {
		if q, ok := a.cfg.Rooms.SendLocalQueued(ctx, []*buspb.SendRequest{send}); ok {
			return queuedSend{waits: q.Waits(), wait: func() (*apipb.SendResponse, error) {
				rep := q.Reply()
				return answered(rep, refusal(rep))
			}}
		}
	}
	return queuedSend{waits: true, remote: true, wait: func() (*apipb.SendResponse, error) {
		rep := new(buspb.Reply)
		return answered(rep, a.ask(ctx, bus.SubjectRoomSend, send, rep))
	}}
}

// SendBatchToRoom implements RoomcastAPI.
func (a *API) SendBatchToRoom(ctx context.Context, req *apipb.SendBatchToRoomRequest) (*apipb.SendBatchResponse, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if n := len(req.Messages); n == 0 || n > roomstore.MaxBatch {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a batch holds 1 to %d messages, not %d", roomstore.MaxBatch, n)
	}
	batch := &buspb.SendBatchRequest{Sends: make([]*buspb.SendRequest, len(req.Messages))}
	for i, m := range req.Messages {
		lane, body, err := message(m.Type, m.Lane, m.Body, m.BodyBase64, m.Sender)
		if err != nil {
			code, msg := errorCodeOf(err)
			return nil, apiError(code, "message %d: %s", i, msg)
		}
		batch.Sends[i] = &buspb.SendRequest{App: appOf(ctx), Room: req.Room, Uid: m.Sender, Type: m.Type, Lane: lane, Body: body, TagExpr: m.TagExpr}
	}
	rep, err := a.sendToRoom(ctx, bus.SubjectRoomSendBatch, batch, batch.Sends...)
	if err != nil {
		return nil, err
	}
	return &apipb.SendBatchResponse{Ids: rep.MessageIds, ServerTimeMs: rep.ServerTimeMs}, nil
}

// sendToRoom hands sends to one room to the room service in this process (Config.Rooms) when
// it takes them, and otherwise asks the room service over NATS with req on subject.
func (a *API) sendToRoom(ctx context.Context, subject string, req proto.Message, sends ...*buspb.SendRequest) (*buspb.Reply, error) {
	if a.cfg.Rooms != nil {
		if q, ok := a.cfg.Rooms.SendLocalQueued(ctx, sends); ok {
			rep := q.Reply()
			return rep, refusal(rep)
		}
	}
	rep := new(buspb.Reply)
	if err := a.ask(ctx, subject, req, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// SendToUsers implements RoomcastAPI.
func (a *API) SendToUsers(ctx context.Context, req *apipb.SendToUsersRequest) (*apipb.SendToUsersResponse, error) {
	app := appOf(ctx)
	if len(req.Uids) == 0 || len(req.Uids) > maxUIDsPerSend {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "uids must list 1 to %d users", maxUIDsPerSend)
	}
	for _, uid := range req.Uids {
		if !auth.ValidName(uid) {
			return nil, badName("uid", uid)
		}
	}
	lane, body, err := message(req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	m := &clientpb.Message{Id: a.ids.New(now), Sender: req.Sender, Type: req.Type, Lane: lane, Body: body, ServerTimeMs: now.UnixMilli()}
	out := &apipb.SendToUsersResponse{Id: m.Id, ServerTimeMs: m.ServerTimeMs, Offline: []string{}}
	uids := req.Uids
	if req.AtLeastOnce {
		// Stored before the sessions are looked up: a login after the store reads it, a session
		// found gets it live, so no user falls between the two (users.go).
		if uids, err = a.storeForUsers(ctx, app, req, m, out); err != nil {
			return nil, err
		}
	}
	sessions, err := a.sessionsOf(ctx, app, uids...)
	if err == nil {
		out.Sessions, err = a.toNodes(ctx, sessions, &buspb.NodeControl{Op: buspb.NodeControl_OP_DELIVER, App: app, Message: m})
	}
	switch {
	case err != nil && !req.AtLeastOnce:
		return nil, err
	case err != nil:
		a.log.Warn("at-least-once message stored but not delivered live: the sessions get it at their next login", "id", m.Id, "err", err)
	}
	for _, uid := range uids {
		if !slices.ContainsFunc(sessions, func(s *buspb.SessionEvent) bool { return s.Uid == uid }) && !slices.Contains(out.Offline, uid) {
			out.Offline = append(out.Offline, uid)
		}
	}
	return out, nil
}

// SendToSession implements RoomcastAPI. It asks the session's ChatLink, which its id names,
// rather than presence: the node knows its connections at once (presence learns of a login up
// to a batch later), and it answers whether the session took the message.
func (a *API) SendToSession(ctx context.Context, req *apipb.SendToSessionRequest) (*apipb.SendResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	node, ok := ids.SessionNode(req.SessionId)
	if !ok || !auth.ValidName(req.SessionId) {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session_id %q is not a session id (<node>-<n>, as LoginAck and GetUserSessions give it)", req.SessionId)
	}
	lane, body, err := message(req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	m := &clientpb.Message{Id: a.ids.New(now), Sender: req.Sender, Type: req.Type, Lane: lane, Body: body, ServerTimeMs: now.UnixMilli()}
	var rep buspb.NodeControlReply
	ctrl := &buspb.NodeControl{Op: buspb.NodeControl_OP_DELIVER, App: app, Uid: req.Uid, Sessions: []string{req.SessionId}, Message: m}
	switch err := a.request(ctx, bus.NodeSubject(node), ctrl, &rep); {
	case errors.Is(err, nats.ErrNoResponders):
		// No ChatLink of that name is on the bus: the session ended with its node.
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "session %q of user %q is not online: its ChatLink %q is not running", req.SessionId, req.Uid, node)
	case err != nil:
		return nil, a.internal("deliver to session", err)
	}
	if err := refusal(&rep); err != nil {
		return nil, err
	}
	if rep.Affected == 0 {
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "session %q of user %q is not online", req.SessionId, req.Uid)
	}
	return &apipb.SendResponse{Id: m.Id, ServerTimeMs: m.ServerTimeMs}, nil
}

// maxNoticeSpread bounds SendToAllRooms' spread_ms.
const maxNoticeSpread = time.Minute

// SendToAllRooms implements RoomcastAPI. The notice is published once to every ChatLink
// (rc.nodes.control), not once per room: each node writes it to the rooms of the app it holds,
// spreading them over the spread (chatlink/notice.go). Nothing is asked of the room service:
// the notice has no room_seq and stays out of the rooms' history.
func (a *API) SendToAllRooms(ctx context.Context, req *apipb.SendToAllRoomsRequest) (*apipb.SendToAllRoomsResponse, error) {
	lane, body, err := message(req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender)
	if err != nil {
		return nil, err
	}
	spread := time.Duration(req.SpreadMs) * time.Millisecond
	switch {
	case spread > maxNoticeSpread:
		return nil, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "spread_ms %d is over %d", req.SpreadMs, maxNoticeSpread.Milliseconds())
	case spread == 0:
		spread = a.cfg.NoticeSpread
	case spread < 0:
		spread = 0
	}
	now := time.Now()
	m := &clientpb.Message{Id: a.ids.New(now), Sender: req.Sender, Type: req.Type, Lane: lane, Body: body, ServerTimeMs: now.UnixMilli()}
	if err := a.broadcast(&buspb.NodeControl{Op: buspb.NodeControl_OP_NOTICE, App: appOf(ctx), Message: m, SpreadMs: int32(spread.Milliseconds())}); err != nil {
		return nil, err
	}
	return &apipb.SendToAllRoomsResponse{Id: m.Id, ServerTimeMs: m.ServerTimeMs, SpreadMs: int32(spread.Milliseconds())}, nil
}
