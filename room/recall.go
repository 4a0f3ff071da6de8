package room

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/internal/ids"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/historystore"
)

// Recall (docs/api.md and docs/protocol.md, "Recall"): a message leaves the room's history and
// its members are told to drop it. The history is a stream of immutable records, so a recall
// does not rewrite the record that holds the message: it appends a RecallRecord after it
// (historystore.RecallHeader), which every reader of the history applies, then broadcasts a
// Recall on the room's subject. The server API asks on bus.SubjectRoomRecall, and so does a
// ChatLink for a member's recall of its own message; a moderator's recall (room/moderate.go)
// checks the sender's scope, then goes through Recall with by_uid.

// MaxSenderRecallWindow is the longest RoomSettings.sender_recall_window_s may say.
const MaxSenderRecallWindow = time.Hour

// maxUnkeptRecallAge is how old a message history does not keep (a bulk danmaku) may be for
// the app server to recall it by id (RoomRecallRequest.unkept): the segments that carry it are
// polled within seconds of it, and a client remembers recalled ids for about as long as it
// drops duplicates.
const maxUnkeptRecallAge = time.Hour

// keepWait is how young a message may be that a recall waits for when history does not hold it
// yet (its batch window is still open, or being kept), looking again every keepPoll.
const (
	keepWait = 1500 * time.Millisecond
	keepPoll = 100 * time.Millisecond
)

// recallTimeout bounds a recall: reading the room's history, storing the record, broadcasting.
const recallTimeout = 3 * time.Second

func (s *Service) onRecall(msg *nats.Msg) {
	start := time.Now()
	var req buspb.RoomRecallRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opRecall, start, rep)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), recallTimeout)
	defer cancel()
	s.respond(msg, opRecall, start, s.Recall(ctx, &req))
}

// Recall recalls a message of a room: it answers the refusal, or the message recalled (with
// already_recalled when a recall took it out before: that recall, as stored, is broadcast
// again, which clients that had it ignore, so that a retry after a failed broadcast reaches
// them). A request with a uid is the member's recall of a message it sent: the room's
// sender_recall_window_s must allow it, and the history must name the member as the
// message's sender.
func (s *Service) Recall(ctx context.Context, req *buspb.RoomRecallRequest) *buspb.Reply {
	at, ok := ids.MessageTime(req.MessageId)
	switch {
	case !auth.ValidName(req.Room):
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "room must be a valid name")
	case !ok:
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "message_id is not a message id (26 characters of Crockford base32)")
	case req.Uid != "" && req.Unkept:
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "a member recalls only messages history keeps")
	}
	now := s.cfg.Now()
	meta := s.cache.room(req.App, req.Room)
	switch {
	case meta == nil && s.cfg.RequireCreated:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room does not exist")
	case meta.GetStatus() == apipb.RoomStatus_ROOM_STATUS_CLOSED:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room is closed")
	}
	var window time.Duration
	if req.Uid != "" {
		window = time.Duration(meta.GetSettings().GetSenderRecallWindowS()) * time.Second
		if window <= 0 {
			return refuse(clientpb.ErrorCode_ERROR_CODE_RECALL_NOT_ALLOWED, 0, "this room does not let members recall their messages")
		}
		window = min(window, MaxSenderRecallWindow)
	}
	kept, stored, err := s.find(ctx, req.App, req.Room, req.MessageId, at, !req.Unkept)
	if err != nil {
		s.log.Warn("history not read for a recall", "app", req.App, "room", req.Room, "err", err)
		return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the room's history could not be read")
	}
	by := cmp.Or(req.Uid, req.ByUid)
	if stored != nil {
		// Recalled before: the stored recall is broadcast again as it was (its time, whoever
		// made it), never as this request's. A member may ask only of its own message.
		if req.Uid != "" && kept != nil && kept.Msg.GetSender() != req.Uid {
			return refuse(clientpb.ErrorCode_ERROR_CODE_RECALL_NOT_ALLOWED, 0, "a member may recall only its own messages")
		}
		if rep := s.broadcastRecall(req, stored); rep != nil {
			return rep
		}
		return &buspb.Reply{Recalled: stored, AlreadyRecalled: true}
	}
	switch {
	case kept == nil && !req.Unkept:
		// The id is not repeated: an answer names nothing of another room's.
		return refuse(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND, 0, "the room's history holds no such message (never sent here, no longer kept, or a bulk message: the server API recalls those with unkept)")
	case kept == nil && now.Sub(at) > maxUnkeptRecallAge:
		return refuse(clientpb.ErrorCode_ERROR_CODE_MESSAGE_NOT_FOUND, 0, fmt.Sprintf("the message is older than %v: an unkept message can no longer be recalled", maxUnkeptRecallAge))
	case req.Uid != "" && kept.Msg.GetSender() != req.Uid:
		return refuse(clientpb.ErrorCode_ERROR_CODE_RECALL_NOT_ALLOWED, 0, "a member may recall only its own messages")
	case req.Uid != "" && now.Sub(time.UnixMilli(kept.Msg.GetServerTimeMs())) > window:
		return refuse(clientpb.ErrorCode_ERROR_CODE_RECALL_WINDOW_PASSED, 0, fmt.Sprintf("this room lets members recall their messages for %v after sending them", window))
	}
	done := &clientpb.RecalledMessage{Id: req.MessageId, RecalledMs: now.UnixMilli(), ByUid: by}
	if err := s.hist.recall(ctx, req.App, req.Room, done); err != nil {
		s.log.Warn("recall not stored", "app", req.App, "room", req.Room, "id", req.MessageId, "err", err)
		return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the recall could not be stored")
	}
	// Stored: history, logins and recoveries leave the message out from here on, whatever
	// becomes of the broadcast.
	if rep := s.broadcastRecall(req, done); rep != nil {
		return rep
	}
	return &buspb.Reply{Recalled: done}
}

// find looks for a message in the room's history (historystore.Find). A message is kept when
// its batch window leaves, a little after its send was answered (at once for the normal and
// bulk lanes): with wait, a message young enough that history may not hold it yet is looked for
// again until it is keepWait old.
func (s *Service) find(ctx context.Context, app, room, id string, at time.Time, wait bool) (kept *historystore.KeptMessage, recalled *clientpb.RecalledMessage, err error) {
	kept, recalled, err = historystore.Find(ctx, s.hist.js, app, room, id, at)
	for err == nil && kept == nil && recalled == nil && wait && s.cfg.Now().Sub(at) < keepWait {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(keepPoll):
			kept, recalled, err = historystore.Find(ctx, s.hist.js, app, room, id, at)
		}
	}
	return kept, recalled, err
}

// broadcastRecall tells the room's ChatLinks of a stored recall; it returns the refusal if the
// bus did not take it (the members online still show the message: a retry sends it again).
func (s *Service) broadcastRecall(req *buspb.RoomRecallRequest, done *clientpb.RecalledMessage) *buspb.Reply {
	err := bus.Publish(s.cfg.Bus, bus.RoomSubject(req.App, req.Room), &buspb.RoomBatch{Recall: &clientpb.Recall{Messages: []*clientpb.RecalledMessage{done}}})
	if err != nil {
		s.log.Warn("recall stored but not broadcast", "app", req.App, "room", req.Room, "id", req.MessageId, "err", err)
		return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the recall is stored but was not sent to the room's members: retry")
	}
	return nil
}

// recall appends the record of a recall to the room's history and waits until it is stored.
func (h *history) recall(ctx context.Context, app, room string, done *clientpb.RecalledMessage) error {
	b, err := proto.Marshal(&buspb.RecallRecord{MessageIds: []string{done.Id}, RecalledMs: done.RecalledMs, ByUid: done.ByUid})
	if err != nil {
		return fmt.Errorf("room: encode recall: %w", err)
	}
	m := nats.NewMsg(historystore.Subject(app, room))
	m.Header.Set(historystore.RecallHeader, "1")
	m.Data = b
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("room: store recall of %s/%s: %w", app, room, err)
	}
	return nil
}
