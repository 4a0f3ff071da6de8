package room

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	"roomcast/internal/ids"
	pb "roomcast/proto/roomcastpb"
	"roomcast/tag"
)

// Limits of the server API.
const (
	// maxAPIBody limits a request: an HTTP body, or a gRPC message.
	maxAPIBody = 64 << 10
	// maxUIDsPerSend limits the users one SendToUsers names.
	maxUIDsPerSend = 100
	// maxNameBytes limits a room's display name.
	maxNameBytes = 256
	// defaultPageSize and maxPageSize bound a member list page.
	defaultPageSize = 100
	maxPageSize     = 1000
)

// APIConfig configures the server API.
type APIConfig struct {
	// Bus is the NATS connection to the services. Required; its server must have JetStream.
	Bus *nats.Conn
	// Keys maps API keys to apps. Required.
	Keys auth.APIKeys
	// Timeout bounds each request to a service or a node. Zero value means 3s.
	Timeout time.Duration
	// Log receives the API's logs. Zero value means none.
	Log *slog.Logger
	// KVReplicas is the replication of the KV buckets, when the API creates them. Zero value
	// means 1.
	KVReplicas int
}

// API is the server API for app backends: a gRPC service (RoomcastAPI in proto/api.proto) and
// the same calls over HTTP/JSON (api_http.go). Every call carries an API key, which names the
// app it acts for; rooms and users of other apps are invisible to it. The API keeps no state:
// it writes rooms and restrictions to JetStream KV and asks the services and the ChatLinks over
// NATS, so any number of instances can serve.
type API struct {
	pb.UnimplementedRoomcastAPIServer

	cfg   APIConfig
	log   *slog.Logger
	store *store
	ids   ids.Generator
	mux   *http.ServeMux
	exprs *tag.Cache // tag expressions checked, compiled once
}

var _ pb.RoomcastAPIServer = (*API)(nil)

// NewAPI opens the KV buckets and returns the server API.
func NewAPI(cfg APIConfig) (*API, error) {
	if cfg.Bus == nil {
		return nil, errors.New("room: APIConfig.Bus is required")
	}
	if len(cfg.Keys) == 0 {
		return nil, errors.New("room: APIConfig.Keys needs at least one key")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := openStore(ctx, cfg.Bus, cfg.KVReplicas)
	if err != nil {
		return nil, err
	}
	a := &API{cfg: cfg, log: log.With("svc", "api"), store: st, exprs: tag.NewCache(exprCacheSize)}
	a.routes()
	return a, nil
}

// NewGRPCServer returns a gRPC server serving the API (and the reflection service, for
// grpcurl). The caller serves it on a listener and stops it.
func (a *API) NewGRPCServer() *grpc.Server {
	s := grpc.NewServer(grpc.UnaryInterceptor(a.authenticate), grpc.MaxRecvMsgSize(maxAPIBody))
	pb.RegisterRoomcastAPIServer(s, a)
	reflection.Register(s)
	return s
}

type appKey struct{}

// appOf returns the app the call acts for, put there by the API key check.
func appOf(ctx context.Context) string { s, _ := ctx.Value(appKey{}).(string); return s }

// appFor returns the app an "Authorization: Bearer KEY" value names.
func (a *API) appFor(authorization string) (string, error) {
	key, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return "", apiError(pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "missing authorization: Bearer <API key>")
	}
	app, ok := a.cfg.Keys.App(key)
	if !ok {
		return "", apiError(pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "unknown API key")
	}
	return app, nil
}

// authenticate is the gRPC interceptor that checks the API key in the call's metadata.
func (a *API) authenticate(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !strings.HasPrefix(info.FullMethod, "/"+pb.RoomcastAPI_ServiceDesc.ServiceName+"/") {
		return h(ctx, req) // another service on the same server (the dispatcher's) has its own rules
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var authz string
	if v := md.Get("authorization"); len(v) > 0 {
		authz = v[0]
	}
	app, err := a.appFor(authz)
	if err != nil {
		return nil, err
	}
	return h(context.WithValue(ctx, appKey{}, app), req)
}

// apiError is an error of the API: a gRPC status whose ErrorInfo detail carries the ErrorCode.
func apiError(code pb.ErrorCode, format string, args ...any) error {
	st := status.New(grpcCode(code), fmt.Sprintf(format, args...))
	if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   codeName(code),
		Domain:   "roomcast",
		Metadata: map[string]string{"code": strconv.Itoa(int(code))},
	}); err == nil {
		st = withInfo
	}
	return st.Err()
}

func codeName(code pb.ErrorCode) string { return strings.TrimPrefix(code.String(), "ERROR_CODE_") }

// grpcCode maps an error code to the gRPC status code that carries it.
func grpcCode(code pb.ErrorCode) codes.Code {
	if m, ok := errorMappings[code]; ok {
		return m.grpc
	}
	return codes.Internal
}

// errorMappings gives each error code its gRPC code and HTTP status (httpStatus); a code not
// here is Internal / 500.
var errorMappings = map[pb.ErrorCode]struct {
	grpc codes.Code
	http int
}{
	pb.ErrorCode_ERROR_CODE_OK:                {codes.OK, http.StatusOK},
	pb.ErrorCode_ERROR_CODE_BAD_REQUEST:       {codes.InvalidArgument, http.StatusBadRequest},
	pb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR:      {codes.InvalidArgument, http.StatusBadRequest},
	pb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE: {codes.ResourceExhausted, http.StatusRequestEntityTooLarge},
	pb.ErrorCode_ERROR_CODE_RATE_LIMITED:      {codes.ResourceExhausted, http.StatusTooManyRequests},
	pb.ErrorCode_ERROR_CODE_FORBIDDEN:         {codes.PermissionDenied, http.StatusForbidden},
	pb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND:    {codes.NotFound, http.StatusNotFound},
	pb.ErrorCode_ERROR_CODE_USER_NOT_FOUND:    {codes.NotFound, http.StatusNotFound},
	pb.ErrorCode_ERROR_CODE_CONFLICT:          {codes.FailedPrecondition, http.StatusConflict},
	pb.ErrorCode_ERROR_CODE_UNAUTHORIZED:      {codes.Unauthenticated, http.StatusUnauthorized},
	pb.ErrorCode_ERROR_CODE_UNAVAILABLE:       {codes.Unavailable, http.StatusServiceUnavailable},
}

// errorCodeOf recovers the ErrorCode of an error returned by an API method.
func errorCodeOf(err error) (pb.ErrorCode, string) {
	st, ok := status.FromError(err)
	if !ok {
		return pb.ErrorCode_ERROR_CODE_INTERNAL, err.Error()
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if n, err := strconv.Atoi(info.Metadata["code"]); err == nil {
				return pb.ErrorCode(n), st.Message()
			}
		}
	}
	switch st.Code() {
	case codes.ResourceExhausted:
		return pb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, st.Message()
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return pb.ErrorCode_ERROR_CODE_UNAVAILABLE, st.Message()
	}
	return pb.ErrorCode_ERROR_CODE_INTERNAL, st.Message()
}

// internal logs err and returns the error a caller sees: UNAVAILABLE when a service or JetStream
// did not answer in time, INTERNAL otherwise.
func (a *API) internal(what string, err error) error {
	a.log.Warn(what, "err", err)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return apiError(pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "%s: a service did not answer in time", what)
	}
	return apiError(pb.ErrorCode_ERROR_CODE_INTERNAL, "%s failed", what)
}

func badName(what, v string) error {
	return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%s %q must be 1-128 characters of A-Z a-z 0-9 _ -", what, v)
}

func (a *API) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.cfg.Timeout)
}

// codedReply is a service's answer that carries an error code (Reply, NodeControlReply,
// PresenceReply).
type codedReply interface {
	proto.Message
	GetCode() uint32
	GetMessage() string
}

// ask sends a request to a service and decodes the answer. An answer with an error code is
// that error.
func (a *API) ask(ctx context.Context, subject string, req proto.Message, rep codedReply) error {
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	if err := bus.Request(ctx, a.cfg.Bus, subject, req, rep); err != nil {
		return a.internal("request "+subject, err)
	}
	if code := rep.GetCode(); code != 0 {
		return apiError(pb.ErrorCode(code), "%s", rep.GetMessage())
	}
	return nil
}

func (a *API) roomInfo(ctx context.Context, app, room string) (*pb.RoomInfo, error) {
	var rep pb.Reply
	if err := a.ask(ctx, bus.SubjectRoomInfo, &pb.JoinRequest{App: app, Room: room}, &rep); err != nil {
		return nil, err
	}
	return rep.Room, nil
}

// existing returns a room's record (nil for an implicit room) and its members online; a room
// that was never created and has nobody online does not exist.
func (a *API) existing(ctx context.Context, app, room string) (*pb.Room, *pb.RoomInfo, error) {
	if !auth.ValidName(room) {
		return nil, nil, badName("room", room)
	}
	meta, _, err := a.store.getRoom(ctx, app, room)
	if err != nil {
		return nil, nil, a.internal("read room", err)
	}
	info, err := a.roomInfo(ctx, app, room)
	if err != nil {
		return nil, nil, err
	}
	if meta == nil && info.Online == 0 {
		return nil, nil, apiError(pb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, "room %q does not exist", room)
	}
	return meta, info, nil
}

func (a *API) checkSettings(s *pb.RoomSettings) error {
	switch {
	case s == nil:
		return nil
	case s.FlushTickMs > MaxFlushTickMS:
		return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "flush_tick_ms must be at most %d", MaxFlushTickMS)
	case s.ScopePrefix != "" && tag.Validate([]string{s.ScopePrefix}) != nil:
		return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "scope_prefix %q is not the start of a valid tag", s.ScopePrefix)
	case s.MaxMembers < 0:
		return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "max_members must not be negative")
	case pb.SendPolicy_name[int32(s.WhoMaySend)] == "":
		return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown who_may_send %d", s.WhoMaySend)
	}
	for name, src := range map[string]string{"send_expr": s.SendExpr, "broadcast_expr": s.BroadcastExpr} {
		if src == "" {
			continue
		}
		if _, err := a.exprs.Get(src); err != nil {
			return apiError(pb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR, "%s: %v", name, err)
		}
	}
	return nil
}

// MaxFlushTickMS bounds a room's flush tick.
const MaxFlushTickMS = 1000

// announceSettings tells the ChatLinks holding a room that its settings changed; they apply
// them in order with the room's messages.
func (a *API) announceSettings(app string, r *pb.Room) {
	if r == nil {
		return
	}
	settings := r.Settings
	if settings == nil {
		settings = &pb.RoomSettings{}
	}
	if err := bus.Publish(a.cfg.Bus, bus.RoomSubject(app, r.Room), &pb.RoomBatch{Settings: settings}); err != nil {
		a.log.Warn("settings change not announced", "app", app, "room", r.Room, "err", err)
	}
}

func checkRoomFields(name, owner string) error {
	switch {
	case len(name) > maxNameBytes || !utf8.ValidString(name):
		return apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "name must be valid UTF-8 of at most %d bytes", maxNameBytes)
	case owner != "" && !auth.ValidName(owner):
		return badName("owner", owner)
	}
	return nil
}

// CreateRoom implements RoomcastAPI.
func (a *API) CreateRoom(ctx context.Context, req *pb.CreateRoomRequest) (*pb.CreateRoomResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if err := checkRoomFields(req.Name, req.Owner); err != nil {
		return nil, err
	}
	if err := a.checkSettings(req.Settings); err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	now := time.Now().UnixMilli()
	settings := req.Settings
	if settings == nil {
		settings = &pb.RoomSettings{}
	}
	r := &pb.Room{Room: req.Room, Name: req.Name, Owner: req.Owner, CreatedMs: now, UpdatedMs: now, Status: pb.RoomStatus_ROOM_STATUS_OPEN, Settings: settings}
	created, err := a.store.createRoom(ctx, app, r)
	if err != nil {
		return nil, a.internal("create room", err)
	}
	if created {
		// Members may be in the room already: rooms open implicitly at their first login.
		a.announceSettings(app, r)
		return &pb.CreateRoomResponse{Room: r, Created: true}, nil
	}
	reopened := false
	r, err = a.store.updateRoom(ctx, app, req.Room, func(old *pb.Room) error {
		reopened = old.Status == pb.RoomStatus_ROOM_STATUS_CLOSED
		if reopened {
			old.Name, old.Owner, old.Settings, old.Status, old.CloseReason, old.Muted, old.UpdatedMs = req.Name, req.Owner, settings, pb.RoomStatus_ROOM_STATUS_OPEN, "", false, now
		}
		return nil
	})
	if err != nil {
		return nil, a.internal("create room", err)
	}
	if reopened {
		a.announceSettings(app, r)
		// The nodes forget the close, or they would refuse logins for a while.
		if err := a.broadcast(&pb.NodeControl{Op: pb.NodeControl_OP_CLOSE_ROOM, App: app, Room: req.Room, Lift: true}); err != nil {
			return nil, err
		}
	}
	return &pb.CreateRoomResponse{Room: r, Created: reopened}, nil
}

// UpdateRoom implements RoomcastAPI.
func (a *API) UpdateRoom(ctx context.Context, req *pb.UpdateRoomRequest) (*pb.Room, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if err := checkRoomFields(req.GetName(), req.GetOwner()); err != nil {
		return nil, err
	}
	if err := a.checkSettings(req.Settings); err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.updateRoom(ctx, app, req.Room, func(r *pb.Room) error {
		if r.Status == pb.RoomStatus_ROOM_STATUS_CLOSED {
			return apiError(pb.ErrorCode_ERROR_CODE_CONFLICT, "room %q is closed; create it again to reopen it", req.Room)
		}
		if req.Name != nil {
			r.Name = *req.Name
		}
		if req.Owner != nil {
			r.Owner = *req.Owner
		}
		if req.Settings != nil {
			r.Settings = req.Settings
		}
		r.UpdatedMs = time.Now().UnixMilli()
		return nil
	})
	if err == nil && req.Settings != nil {
		a.announceSettings(app, r)
	}
	return r, a.storeError("update room", req.Room, err)
}

// storeError turns an error of a KV update into the API's answer.
func (a *API) storeError(what, room string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errRoomNotFound):
		return apiError(pb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND, "room %q was not created", room)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return a.internal(what, err)
}

// CloseRoom implements RoomcastAPI.
func (a *API) CloseRoom(ctx context.Context, req *pb.CloseRoomRequest) (*pb.CloseRoomResponse, error) {
	app := appOf(ctx)
	if len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason) {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	meta, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	now := time.Now().UnixMilli()
	closeIt := func(r *pb.Room) error {
		r.Status, r.CloseReason, r.UpdatedMs = pb.RoomStatus_ROOM_STATUS_CLOSED, req.Reason, now
		return nil
	}
	if meta == nil {
		// An implicit room with members: record it, closed.
		r := &pb.Room{Room: req.Room, CreatedMs: now, Settings: &pb.RoomSettings{}}
		_ = closeIt(r)
		if _, err := a.store.createRoom(ctx, app, r); err != nil {
			return nil, a.internal("close room", err)
		}
	}
	r, err := a.store.updateRoom(ctx, app, req.Room, closeIt)
	if err != nil {
		return nil, a.storeError("close room", req.Room, err)
	}
	reason := req.Reason
	if reason == "" {
		reason = "room closed"
	}
	if err := a.broadcast(&pb.NodeControl{Op: pb.NodeControl_OP_CLOSE_ROOM, App: app, Room: req.Room, Reason: reason}); err != nil {
		return nil, err
	}
	return &pb.CloseRoomResponse{Room: r, Kicked: info.Online}, nil
}

// broadcast tells every ChatLink, and makes sure the NATS server has it before returning.
func (a *API) broadcast(req *pb.NodeControl) error {
	if err := bus.Publish(a.cfg.Bus, bus.SubjectNodesControl, req); err != nil {
		return a.internal("tell the nodes", err)
	}
	if err := a.cfg.Bus.Flush(); err != nil {
		return a.internal("tell the nodes", err)
	}
	return nil
}

// GetRoom implements RoomcastAPI.
func (a *API) GetRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.GetRoomResponse, error) {
	meta, info, err := a.existing(ctx, appOf(ctx), req.Room)
	if err != nil {
		return nil, err
	}
	return &pb.GetRoomResponse{Room: req.Room, Online: info.Online, Nodes: info.Nodes, Meta: meta}, nil
}

// pageToken is where a member list goes on: a node, and the last session listed there.
func pageToken(node, after string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(node + "\n" + after))
}

func parsePageToken(tok string) (node, after string, err error) {
	if tok == "" {
		return "", "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil {
		var ok bool
		if node, after, ok = strings.Cut(string(b), "\n"); ok && auth.ValidName(node) {
			return node, after, nil
		}
	}
	return "", "", apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "page_token is not one this API handed out")
}

// ListMembers implements RoomcastAPI. It walks the nodes that hold the room in name order and
// asks each for a page of its members in session id order; the page token says where to go on.
func (a *API) ListMembers(ctx context.Context, req *pb.ListMembersRequest) (*pb.ListMembersResponse, error) {
	app := appOf(ctx)
	size := int(req.PageSize)
	switch {
	case size == 0:
		size = defaultPageSize
	case size < 0 || size > maxPageSize:
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "page_size must be 0 to %d", maxPageSize)
	case len(req.Tag) > 128:
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "tag is longer than 128 bytes")
	}
	fromNode, after, err := parsePageToken(req.PageToken)
	if err != nil {
		return nil, err
	}
	_, info, err := a.existing(ctx, app, req.Room)
	if err != nil {
		return nil, err
	}
	nodes := make([]string, 0, len(info.Nodes))
	for n := range info.Nodes {
		if n >= fromNode {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	out := &pb.ListMembersResponse{Members: []*pb.RoomMember{}}
	for i, node := range nodes {
		from := ""
		if node == fromNode {
			from = after
		}
		var rep pb.NodeControlReply
		if err := a.ask(ctx, bus.NodeSubject(node), &pb.NodeControl{
			Op: pb.NodeControl_OP_MEMBERS, App: app, Room: req.Room, Tag: req.Tag, After: from, Limit: int32(size - len(out.Members)),
		}, &rep); err != nil {
			return nil, err
		}
		for _, m := range rep.Members {
			out.Members = append(out.Members, &pb.RoomMember{Uid: m.Uid, SessionId: m.SessionId, Node: m.Node, Device: m.Device, Tags: m.Tags, LoginTimeMs: m.LoginTimeMs})
		}
		if len(out.Members) >= size {
			switch {
			case rep.More && len(rep.Members) > 0:
				out.NextPageToken = pageToken(node, rep.Members[len(rep.Members)-1].SessionId)
			case i+1 < len(nodes):
				out.NextPageToken = pageToken(nodes[i+1], "")
			}
			break
		}
	}
	return out, nil
}

// message checks the parts of a message common to sends to a room and to users.
func message(typ, laneName, text string, binary []byte, sender string) (pb.Lane, []byte, error) {
	lane, ok := ParseLane(laneName)
	switch {
	case !ok:
		return 0, nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "lane %q is not critical, normal or bulk", laneName)
	case text != "" && len(binary) > 0:
		return 0, nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "set body or body_base64, not both")
	case sender != "" && !auth.ValidName(sender):
		return 0, nil, badName("sender", sender)
	}
	body := binary
	if text != "" {
		body = []byte(text)
	}
	if rep := ValidateSend(&pb.SendRequest{App: "-", Room: "-", Type: typ, Lane: lane, Body: body}, nil); rep != nil {
		return 0, nil, apiError(pb.ErrorCode(rep.Code), "%s", rep.Message)
	}
	return lane, body, nil
}

// ParseLane maps a lane name to its Lane; "" is normal.
func ParseLane(s string) (pb.Lane, bool) {
	switch strings.ToLower(s) {
	case "", "normal":
		return pb.Lane_LANE_NORMAL, true
	case "critical":
		return pb.Lane_LANE_CRITICAL, true
	case "bulk":
		return pb.Lane_LANE_BULK, true
	}
	return 0, false
}

// SendToRoom implements RoomcastAPI.
func (a *API) SendToRoom(ctx context.Context, req *pb.SendToRoomRequest) (*pb.SendResponse, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	lane, body, err := message(req.Type, req.Lane, req.Body, req.BodyBase64, req.Sender)
	if err != nil {
		return nil, err
	}
	// message checked type, lane and body; the room service checks the tag expression.
	send := &pb.SendRequest{App: appOf(ctx), Room: req.Room, Uid: req.Sender, Type: req.Type, Lane: lane, Body: body, TagExpr: req.TagExpr}
	var rep pb.Reply
	if err := a.ask(ctx, bus.SubjectRoomSend, send, &rep); err != nil {
		return nil, err
	}
	return &pb.SendResponse{Id: rep.MessageId, ServerTimeMs: rep.ServerTimeMs}, nil
}

// sessionsOf asks presence for the sessions of uids.
func (a *API) sessionsOf(ctx context.Context, app string, uids ...string) ([]*pb.SessionEvent, error) {
	var rep pb.PresenceReply
	if err := a.ask(ctx, bus.SubjectPresenceSessions, &pb.PresenceQuery{App: app, Uids: uids}, &rep); err != nil {
		return nil, err
	}
	return rep.Sessions, nil
}

// toNodes sends a control request to the node of each group of sessions and adds up what they
// did.
func (a *API) toNodes(ctx context.Context, sessions []*pb.SessionEvent, req *pb.NodeControl) (int64, error) {
	byNode := make(map[string][]string)
	for _, s := range sessions {
		byNode[s.Node] = append(byNode[s.Node], s.SessionId)
	}
	var total int64
	for node, ids := range byNode {
		r := proto.CloneOf(req)
		r.Sessions = ids
		var rep pb.NodeControlReply
		if err := a.ask(ctx, bus.NodeSubject(node), r, &rep); err != nil {
			return total, err
		}
		total += rep.Affected
	}
	return total, nil
}

// SendToUsers implements RoomcastAPI.
func (a *API) SendToUsers(ctx context.Context, req *pb.SendToUsersRequest) (*pb.SendToUsersResponse, error) {
	app := appOf(ctx)
	if len(req.Uids) == 0 || len(req.Uids) > maxUIDsPerSend {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "uids must list 1 to %d users", maxUIDsPerSend)
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
	sessions, err := a.sessionsOf(ctx, app, req.Uids...)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	m := &pb.Message{Id: a.ids.New(now), Sender: req.Sender, Type: req.Type, Lane: lane, Body: body, ServerTimeMs: now.UnixMilli()}
	n, err := a.toNodes(ctx, sessions, &pb.NodeControl{Op: pb.NodeControl_OP_DELIVER, App: app, Message: m})
	if err != nil {
		return nil, err
	}
	out := &pb.SendToUsersResponse{Id: m.Id, ServerTimeMs: m.ServerTimeMs, Sessions: n, Offline: []string{}}
	for _, uid := range req.Uids {
		if !slices.ContainsFunc(sessions, func(s *pb.SessionEvent) bool { return s.Uid == uid }) && !slices.Contains(out.Offline, uid) {
			out.Offline = append(out.Offline, uid)
		}
	}
	return out, nil
}

// Kick implements RoomcastAPI.
func (a *API) Kick(ctx context.Context, req *pb.KickRequest) (*pb.KickResponse, error) {
	app := appOf(ctx)
	switch {
	case !auth.ValidName(req.Uid):
		return nil, badName("uid", req.Uid)
	case req.Room != "" && !auth.ValidName(req.Room):
		return nil, badName("room", req.Room)
	case len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason):
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	sessions, err := a.sessionsOf(ctx, app, req.Uid)
	if err != nil {
		return nil, err
	}
	sessions = slices.DeleteFunc(sessions, func(s *pb.SessionEvent) bool {
		return (req.Room != "" && s.Room != req.Room) || (req.SessionId != "" && s.SessionId != req.SessionId)
	})
	if len(sessions) == 0 {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "user %q has no such session online", req.Uid)
	}
	n, err := a.toNodes(ctx, sessions, &pb.NodeControl{Op: pb.NodeControl_OP_KICK, App: app, Reason: req.Reason})
	if err != nil {
		return nil, err
	}
	return &pb.KickResponse{Kicked: n}, nil
}

// MuteRoom implements RoomcastAPI.
func (a *API) MuteRoom(ctx context.Context, req *pb.MuteRoomRequest) (*pb.Room, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.updateRoom(ctx, appOf(ctx), req.Room, func(r *pb.Room) error {
		r.Muted, r.UpdatedMs = req.Muted, time.Now().UnixMilli()
		return nil
	})
	return r, a.storeError("mute room", req.Room, err)
}

// restrict checks a mute or ban request and writes it.
func (a *API) restrict(ctx context.Context, room, uid string, duration int64, change func(r *pb.MemberRestriction, until int64)) (*pb.MemberRestriction, error) {
	app := appOf(ctx)
	switch {
	case !auth.ValidName(uid):
		return nil, badName("uid", uid)
	case duration < 0:
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "duration_ms must not be negative")
	}
	if _, _, err := a.existing(ctx, app, room); err != nil {
		return nil, err
	}
	var until int64
	if duration > 0 {
		until = time.Now().UnixMilli() + duration
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	r, err := a.store.updateRestriction(ctx, app, room, uid, func(r *pb.MemberRestriction) { change(r, until) })
	if err != nil {
		return nil, a.internal("write restriction", err)
	}
	return r, nil
}

// MuteMember implements RoomcastAPI.
func (a *API) MuteMember(ctx context.Context, req *pb.MuteMemberRequest) (*pb.MemberRestriction, error) {
	return a.restrict(ctx, req.Room, req.Uid, req.DurationMs, func(r *pb.MemberRestriction, until int64) {
		r.Muted, r.MutedUntilMs = !req.Lift, until
		if req.Lift {
			r.MutedUntilMs = 0
		}
	})
}

// BanMember implements RoomcastAPI. The ban is written first, so the room service refuses the
// user's next logins; then every node is told, so it kicks the user's sessions in the room and
// refuses the logins that passed the room service's check just before.
func (a *API) BanMember(ctx context.Context, req *pb.BanMemberRequest) (*pb.BanMemberResponse, error) {
	if len(req.Reason) > maxNameBytes || !utf8.ValidString(req.Reason) {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reason must be valid UTF-8 of at most %d bytes", maxNameBytes)
	}
	r, err := a.restrict(ctx, req.Room, req.Uid, req.DurationMs, func(r *pb.MemberRestriction, until int64) {
		r.Banned, r.BannedUntilMs, r.Reason = !req.Lift, until, req.Reason
		if req.Lift {
			r.BannedUntilMs, r.Reason = 0, ""
		}
	})
	if err != nil {
		return nil, err
	}
	if req.Lift {
		// The nodes forget the ban too, or they would refuse the user's next login for a while.
		if err := a.broadcast(&pb.NodeControl{Op: pb.NodeControl_OP_BAN, App: appOf(ctx), Room: req.Room, Uid: req.Uid, Lift: true}); err != nil {
			return nil, err
		}
		return &pb.BanMemberResponse{Restriction: r}, nil
	}
	sessions, err := a.sessionsOf(ctx, appOf(ctx), req.Uid)
	if err != nil {
		return nil, err
	}
	var kicked int64
	for _, s := range sessions {
		if s.Room == req.Room {
			kicked++
		}
	}
	reason := req.Reason
	if reason == "" {
		reason = "banned from this room"
	}
	if err := a.broadcast(&pb.NodeControl{Op: pb.NodeControl_OP_BAN, App: appOf(ctx), Room: req.Room, Uid: req.Uid, Reason: reason}); err != nil {
		return nil, err
	}
	return &pb.BanMemberResponse{Restriction: r, Kicked: kicked}, nil
}

// GetUserSessions implements RoomcastAPI.
func (a *API) GetUserSessions(ctx context.Context, req *pb.GetUserSessionsRequest) (*pb.GetUserSessionsResponse, error) {
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	sessions, err := a.sessionsOf(ctx, appOf(ctx), req.Uid)
	if err != nil {
		return nil, err
	}
	out := &pb.GetUserSessionsResponse{Uid: req.Uid, Online: len(sessions) > 0, Sessions: []*pb.Session{}}
	for _, s := range sessions {
		out.Sessions = append(out.Sessions, &pb.Session{SessionId: s.SessionId, Uid: s.Uid, Room: s.Room, Node: s.Node, Device: s.Device, LoginTimeMs: s.TimeMs})
	}
	return out, nil
}

// CountOnline implements RoomcastAPI.
func (a *API) CountOnline(ctx context.Context, _ *pb.CountOnlineRequest) (*pb.CountOnlineResponse, error) {
	var rep pb.PresenceReply
	if err := a.ask(ctx, bus.SubjectPresenceCount, &pb.PresenceQuery{App: appOf(ctx)}, &rep); err != nil {
		return nil, err
	}
	return &pb.CountOnlineResponse{Sessions: rep.SessionsOnline, Users: rep.UsersOnline}, nil
}

// SetMemberTags implements RoomcastAPI.
func (a *API) SetMemberTags(ctx context.Context, req *pb.SetMemberTagsRequest) (*pb.SetMemberTagsResponse, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	if err := tag.Validate(req.Tags); err != nil {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	t := &pb.MemberTags{Uid: req.Uid, Tags: tag.Canonical(req.Tags), UpdatedMs: time.Now().UnixMilli()}
	if err := a.store.putMemberTags(ctx, app, t); err != nil {
		return nil, a.internal("set member tags", err)
	}
	sessions, err := a.sessionsOf(ctx, app, req.Uid)
	if err != nil {
		return nil, err
	}
	n, err := a.toNodes(ctx, sessions, &pb.NodeControl{Op: pb.NodeControl_OP_SET_TAGS, App: app, Tags: t.Tags})
	if err != nil {
		return nil, err
	}
	return &pb.SetMemberTagsResponse{Tags: t, SessionsUpdated: n}, nil
}

// GetMemberTags implements RoomcastAPI.
func (a *API) GetMemberTags(ctx context.Context, req *pb.GetMemberTagsRequest) (*pb.MemberTags, error) {
	app := appOf(ctx)
	if !auth.ValidName(req.Uid) {
		return nil, badName("uid", req.Uid)
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	t, err := a.store.getMemberTags(ctx, app, req.Uid)
	if err != nil {
		return nil, a.internal("get member tags", err)
	}
	if t == nil {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_USER_NOT_FOUND, "no tags stored for user %q: it has its login token's", req.Uid)
	}
	return t, nil
}

// SendBatchToRoom implements RoomcastAPI.
func (a *API) SendBatchToRoom(ctx context.Context, req *pb.SendBatchToRoomRequest) (*pb.SendBatchResponse, error) {
	if !auth.ValidName(req.Room) {
		return nil, badName("room", req.Room)
	}
	if n := len(req.Messages); n == 0 || n > MaxBatch {
		return nil, apiError(pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a batch holds 1 to %d messages, not %d", MaxBatch, n)
	}
	batch := &pb.SendBatchRequest{Sends: make([]*pb.SendRequest, len(req.Messages))}
	for i, m := range req.Messages {
		lane, body, err := message(m.Type, m.Lane, m.Body, m.BodyBase64, m.Sender)
		if err != nil {
			code, msg := errorCodeOf(err)
			return nil, apiError(code, "message %d: %s", i, msg)
		}
		batch.Sends[i] = &pb.SendRequest{App: appOf(ctx), Room: req.Room, Uid: m.Sender, Type: m.Type, Lane: lane, Body: body, TagExpr: m.TagExpr}
	}
	var rep pb.Reply
	if err := a.ask(ctx, bus.SubjectRoomSendBatch, batch, &rep); err != nil {
		return nil, err
	}
	return &pb.SendBatchResponse{Ids: rep.MessageIds, ServerTimeMs: rep.ServerTimeMs}, nil
}
