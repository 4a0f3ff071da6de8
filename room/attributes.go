package room

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/buspb"
	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/store/attrstore"
)

// Members who set room attributes (docs/api.md, "Room attributes"): a room's attributes_expr
// names the members that may set and remove its attributes, and attribute_keys which keys. A
// member's change arrives from its ChatLink as an AttributeRequest; it is held to the same
// limits as the server API's (attrstore), written, and broadcast on the room's subject as the
// API's is, so that every node writes the room's new set to its members.

// DefaultMemberAttributesPerSecond caps the attribute changes a room's members make per second,
// all of them together (per instance), bursts of twice that: each change is a store write and
// a frame to every member of the room.
const DefaultMemberAttributesPerSecond = 5

// onAttributes takes a member's change of its room's attributes.
func (s *Service) onAttributes(msg *nats.Msg) {
	start := time.Now()
	var req buspb.AttributeRequest
	if rep := decode(msg, &req); rep != nil {
		s.respond(msg, opAttributes, start, rep)
		return
	}
	s.respond(msg, opAttributes, start, s.memberAttribute(&req))
}

// memberAttribute checks, writes and broadcasts a member's change; it returns the answer.
func (s *Service) memberAttribute(req *buspb.AttributeRequest) *buspb.Reply {
	if !auth.ValidName(req.App) || !auth.ValidName(req.Room) || req.Uid == "" {
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, "app, room and uid must be valid names")
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeReadTimeout)
	defer cancel()
	// The store's copy, not the cache's: a room whose settings were just changed to let a
	// member in (or out) decides by the new ones.
	meta, _, err := s.store.Room(ctx, req.App, req.Room)
	if err != nil {
		s.log.Warn("room settings read from the cache", "app", req.App, "room", req.Room, "err", err)
		meta = s.cache.room(req.App, req.Room)
	}
	now := s.cfg.Now()
	if rep := s.mayChangeAttribute(req, meta, now); rep != nil {
		return rep
	}
	if ok, retry := s.members.attrs.Take(roomKey{req.App, req.Room}, perSecond(s.cfg.MemberAttributesPerSecond), now); !ok {
		return rateLimited("the room's member attribute rate", retry)
	}
	attrs, err := s.attrs.Set(ctx, req.App, req.Room, req.Key, req.Value, req.Remove, now)
	switch {
	case errors.Is(err, attrstore.ErrBadKey):
		return refuse(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, 0, err.Error())
	case errors.Is(err, attrstore.ErrLimit):
		return refuse(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_FULL, 0, err.Error())
	case err != nil:
		s.log.Error("room attributes not written", "app", req.App, "room", req.Room, "err", err)
		return refuse(clientpb.ErrorCode_ERROR_CODE_UNAVAILABLE, 0, "the room's attributes could not be written; try again")
	}
	if err := bus.Publish(s.cfg.Bus, bus.RoomSubject(req.App, req.Room), &buspb.RoomBatch{Attributes: attrs}); err != nil {
		// Stored: later logins have it; members online learn of the next change.
		s.log.Warn("room attributes change not broadcast", "app", req.App, "room", req.Room, "err", err)
	}
	return &buspb.Reply{ServerTimeMs: now.UnixMilli(), Attributes: attrs}
}

// mayChangeAttribute returns the refusal of a member's change of the room meta describes (nil:
// a room never created, with default settings), or nil when the room permits it.
func (s *Service) mayChangeAttribute(req *buspb.AttributeRequest, meta *apipb.Room, now time.Time) *buspb.Reply {
	st := meta.GetSettings()
	switch {
	case meta.GetStatus() == apipb.RoomStatus_ROOM_STATUS_CLOSED:
		return refuse(clientpb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, 0, "room is closed")
	case st.GetAttributesExpr() == "":
		return refuse(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED, 0, "only the app server sets this room's attributes (the room names no attributes_expr)")
	}
	e, err := s.exprs.Get(st.GetAttributesExpr())
	switch {
	case err != nil:
		// The API checks the expression when the room is set; one that no longer compiles
		// permits nobody.
		return refuse(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED, 0, "the room's attributes_expr does not compile")
	case !e.EvalTags(req.Tags, req.Uid):
		return refuse(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED, 0, "the room's attributes_expr does not permit you to set its attributes")
	case len(st.GetAttributeKeys()) > 0 && !slices.Contains(st.GetAttributeKeys(), req.Key):
		return refuse(clientpb.ErrorCode_ERROR_CODE_ATTRIBUTES_NOT_ALLOWED, 0, "members may not set the attribute "+req.Key+" (the room's attribute_keys do not name it)")
	}
	r := s.cache.restriction(req.App, req.Room, req.Uid)
	switch {
	case bannedAt(r, now):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "banned from this room")
	case mutedAt(r, now):
		return refuse(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, 0, "muted in this room")
	}
	return nil
}
