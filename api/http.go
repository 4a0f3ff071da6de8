package api

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"roomcast/proto/apipb"
	"roomcast/proto/clientpb"
	"roomcast/proto/roompb"
)

// The HTTP/JSON mapping of the server API: each route decodes its request message from the JSON
// body (protojson, field names as in proto/api.proto and room.proto), fills in the path's (and,
// for GET, the query's) parameters by field name, calls the same method the gRPC server calls,
// and writes the answer as JSON with the proto field names, every field present, 64-bit numbers
// as JSON numbers and enums by name. Errors are {"code", "name", "error"} with an HTTP status
// from the error code.

type route struct {
	method, pattern string
	rpc             string // the call's RPC name, which names its scope (scopes.go)
	newReq          func() proto.Message
	call            func(ctx context.Context, req proto.Message) (proto.Message, error)
}

// handle adapts a typed API method to a route.
func handle[Req, Resp proto.Message](method, pattern string, newReq func() Req, f func(context.Context, Req) (Resp, error)) route {
	return route{
		method: method, pattern: pattern, rpc: callName(f),
		newReq: func() proto.Message { return newReq() },
		call: func(ctx context.Context, req proto.Message) (proto.Message, error) {
			return f(ctx, req.(Req))
		},
	}
}

// routes is the route list: each HTTP method and path and the API method it calls.
func (a *API) routes() []route {
	return []route{
		handle("POST", "/v1/rooms", func() *apipb.CreateRoomRequest { return new(apipb.CreateRoomRequest) }, a.CreateRoom),
		handle("PATCH", "/v1/rooms/{room}", func() *apipb.UpdateRoomRequest { return new(apipb.UpdateRoomRequest) }, a.UpdateRoom),
		handle("POST", "/v1/rooms/{room}/close", func() *apipb.CloseRoomRequest { return new(apipb.CloseRoomRequest) }, a.CloseRoom),
		handle("GET", "/v1/rooms/{room}", func() *apipb.GetRoomRequest { return new(apipb.GetRoomRequest) }, a.GetRoom),
		handle("GET", "/v1/rooms/{room}/members", func() *apipb.ListMembersRequest { return new(apipb.ListMembersRequest) }, a.ListMembers),
		handle("POST", "/v1/rooms/{room}/messages", func() *apipb.SendToRoomRequest { return new(apipb.SendToRoomRequest) }, a.SendToRoom),
		handle("POST", "/v1/rooms/{room}/messages/batch", func() *apipb.SendBatchToRoomRequest { return new(apipb.SendBatchToRoomRequest) }, a.SendBatchToRoom),
		handle("POST", "/v1/rooms/{room}/mute", func() *apipb.MuteRoomRequest { return new(apipb.MuteRoomRequest) }, a.MuteRoom),
		handle("POST", "/v1/rooms/{room}/members/{uid}/mute", func() *apipb.MuteMemberRequest { return new(apipb.MuteMemberRequest) }, a.MuteMember),
		handle("POST", "/v1/rooms/{room}/members/{uid}/ban", func() *apipb.BanMemberRequest { return new(apipb.BanMemberRequest) }, a.BanMember),
		handle("POST", "/v1/users/messages", func() *apipb.SendToUsersRequest { return new(apipb.SendToUsersRequest) }, a.SendToUsers),
		handle("POST", "/v1/users/{uid}/sessions/{session_id}/messages", func() *apipb.SendToSessionRequest { return new(apipb.SendToSessionRequest) }, a.SendToSession),
		handle("POST", "/v1/rooms/messages", func() *apipb.SendToAllRoomsRequest { return new(apipb.SendToAllRoomsRequest) }, a.SendToAllRooms),
		handle("POST", "/v1/users/{uid}/kick", func() *apipb.KickRequest { return new(apipb.KickRequest) }, a.Kick),
		handle("GET", "/v1/users/{uid}/sessions", func() *apipb.GetUserSessionsRequest { return new(apipb.GetUserSessionsRequest) }, a.GetUserSessions),
		handle("GET", "/v1/online", func() *apipb.CountOnlineRequest { return new(apipb.CountOnlineRequest) }, a.CountOnline),
		handle("PUT", "/v1/users/{uid}/tags", func() *apipb.SetMemberTagsRequest { return new(apipb.SetMemberTagsRequest) }, a.SetMemberTags),
		handle("GET", "/v1/users/{uid}/tags", func() *apipb.GetMemberTagsRequest { return new(apipb.GetMemberTagsRequest) }, a.GetMemberTags),
		handle("PUT", "/v1/rooms/{room}/cdn", func() *apipb.SetRoomCdnRequest { return new(apipb.SetRoomCdnRequest) }, a.SetRoomCdn),
		handle("GET", "/v1/rooms/{room}/cdn", func() *apipb.GetRoomCdnRequest { return new(apipb.GetRoomCdnRequest) }, a.GetRoomCdn),
		handle("PUT", "/v1/cdn", func() *apipb.CdnPolicy { return new(apipb.CdnPolicy) }, a.SetCdnPolicy),
		handle("GET", "/v1/cdn", func() *apipb.GetCdnPolicyRequest { return new(apipb.GetCdnPolicyRequest) }, a.GetCdnPolicy),
		handle("PUT", "/v1/limits", func() *apipb.AppLimits { return new(apipb.AppLimits) }, a.SetAppLimits),
		handle("GET", "/v1/limits", func() *apipb.GetAppLimitsRequest { return new(apipb.GetAppLimitsRequest) }, a.GetAppLimits),
		handle("GET", "/v1/rooms/{room}/counters", func() *apipb.GetCountersRequest { return new(apipb.GetCountersRequest) }, a.GetCounters),
		handle("DELETE", "/v1/rooms/{room}/counters/{name}", func() *apipb.ResetCounterRequest { return new(apipb.ResetCounterRequest) }, a.ResetCounter),
		handle("GET", "/v1/rooms/{room}/attributes", func() *apipb.GetRoomAttributesRequest { return new(apipb.GetRoomAttributesRequest) }, a.GetRoomAttributes),
		handle("PUT", "/v1/rooms/{room}/attributes/{key}", func() *apipb.SetRoomAttributeRequest { return new(apipb.SetRoomAttributeRequest) }, a.SetRoomAttribute),
		handle("GET", "/v1/rooms/{room}/history", func() *apipb.GetHistoryRequest { return new(apipb.GetHistoryRequest) }, a.GetHistory),
		handle("DELETE", "/v1/rooms/{room}/messages/{message_id}", func() *apipb.RecallMessageRequest { return new(apipb.RecallMessageRequest) }, a.RecallMessage),
		handle("POST", "/v1/rooms/{room}/kick", func() *apipb.KickRequest { return new(apipb.KickRequest) }, a.Kick),
		handle("GET", "/v1/rooms/{room}/online", func() *apipb.CountOnlineRequest { return new(apipb.CountOnlineRequest) }, a.CountOnline),
		handle("GET", "/v1/rooms/{room}/queue", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.ListQueue),
		handle("POST", "/v1/rooms/{room}/queue", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.OfferQueue),
		handle("DELETE", "/v1/rooms/{room}/queue", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.ClearQueue),
		handle("GET", "/v1/rooms/{room}/queue/head", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.PeekQueue),
		handle("POST", "/v1/rooms/{room}/queue/poll", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.PollQueue),
		handle("DELETE", "/v1/rooms/{room}/queue/{key}", func() *roompb.QueueRequest { return new(roompb.QueueRequest) }, a.RemoveQueueEntry),
	}
}

// Register serves the API's routes on mux, each under its method and path: POST /v1/rooms and
// what lies under /v1/rooms/, /v1/users/, /v1/online, /v1/cdn and /v1/limits. It is the one way
// to serve the API over HTTP. Like mux.Handle, it panics if mux already has one of these patterns.
func (a *API) Register(mux *http.ServeMux) {
	for _, r := range a.routes() {
		mux.HandleFunc(r.method+" "+r.pattern, a.observeHTTP(r.method+" "+r.pattern, a.serveRoute(r)))
	}
}

func (a *API) serveRoute(rt route) http.HandlerFunc {
	pathParams := []string{"room", "uid", "key", "name", "session_id", "message_id"}
	return func(w http.ResponseWriter, r *http.Request) {
		// The body must arrive within BodyTimeout, or a client announcing one and sending
		// nothing holds the connection. When the body is not read to its end (a refused key,
		// a body too large) the deadline also bounds net/http's reading of the rest after the
		// answer. net/http sets the connection's next deadline when it reads the next request.
		if r.Body != nil && r.Body != http.NoBody {
			// Not supported by a test's ResponseRecorder: then there is no connection to hold.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.cfg.BodyTimeout))
		}
		app, err := a.authorize(r.Header.Get("Authorization"), rt.rpc)
		if err != nil {
			writeError(w, err)
			return
		}
		if !a.limitHTTP(w, r, app) { // ratelimit.go
			return
		}
		req := rt.newReq()
		observe(w, req)
		buf := bodies.Get().(*bytes.Buffer)
		defer putBody(buf)
		_, err = buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxAPIBody))
		body := buf.Bytes()
		if err != nil {
			var tooBig *http.MaxBytesError
			switch {
			case errors.As(err, &tooBig):
				writeError(w, apiError(clientpb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, "request body over %d bytes", maxAPIBody))
			case errors.Is(err, os.ErrDeadlineExceeded):
				writeError(w, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "the body did not arrive within %v", a.cfg.BodyTimeout))
			default:
				writeError(w, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "reading the body: %v", err))
			}
			return
		}
		if len(body) > 0 && !decodeFast(body, req) {
			if err := protojson.Unmarshal(body, req); err != nil {
				writeError(w, apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "body is not the expected JSON: %v", err))
				return
			}
		}
		m := req.ProtoReflect()
		for _, p := range pathParams {
			if v := r.PathValue(p); v != "" {
				m.Set(m.Descriptor().Fields().ByName(protoreflect.Name(p)), protoreflect.ValueOfString(v))
			}
		}
		if r.Method == http.MethodGet {
			if err := setQuery(m, r); err != nil {
				writeError(w, err)
				return
			}
		}
		resp, err := rt.call(context.WithValue(r.Context(), appKey{}, app), req)
		if err != nil {
			writeError(w, err)
			return
		}
		status := http.StatusOK
		if c, ok := resp.(*apipb.CreateRoomResponse); ok && c.Created {
			status = http.StatusCreated
		}
		writeJSON(w, status, answerJSON(resp))
	}
}

// bodies are the buffers requests' bodies are read into: protojson copies what it keeps of a
// body, so a buffer serves the next request once its request is decoded.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBody(buf *bytes.Buffer) {
	if buf.Cap() <= 2*maxAPIBody { // ReadFrom's growth can overshoot maxAPIBody
		buf.Reset()
		bodies.Put(buf)
	}
}

// decodeFast decodes the body of the routes with a fast path (sendjson.go) and reports whether
// it did; protojson decodes the rest.
func decodeFast(body []byte, req proto.Message) bool {
	if r, ok := req.(*apipb.SendToRoomRequest); ok {
		return decodeSendToRoom(body, r)
	}
	return false
}

// setQuery fills string, integer and boolean fields from the query parameters of the same name;
// a repeated string field takes every value of its parameter, in order.
func setQuery(m protoreflect.Message, r *http.Request) error {
	for name, vals := range r.URL.Query() {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.IsMap() || (fd.IsList() && fd.Kind() != protoreflect.StringKind) {
			return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown query parameter %q", name)
		}
		if fd.IsList() {
			list := m.Mutable(fd).List()
			for _, v := range vals {
				list.Append(protoreflect.ValueOfString(v))
			}
			continue
		}
		v := vals[len(vals)-1]
		switch fd.Kind() {
		case protoreflect.Uint32Kind:
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "query parameter %s=%q is not a number", name, v)
			}
			m.Set(fd, protoreflect.ValueOfUint32(uint32(n)))
		case protoreflect.BoolKind:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "query parameter %s=%q is not true or false", name, v)
			}
			m.Set(fd, protoreflect.ValueOfBool(b))
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(v))
		case protoreflect.Int32Kind:
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "query parameter %s=%q is not a number", name, v)
			}
			m.Set(fd, protoreflect.ValueOfInt32(int32(n)))
		default:
			return apiError(clientpb.ErrorCode_ERROR_CODE_BAD_REQUEST, "query parameter %q cannot be set this way", name)
		}
	}
	return nil
}

// ErrorBody is the JSON body of every HTTP error answer.
type ErrorBody struct {
	Code  uint32 `json:"code"`
	Name  string `json:"name"`
	Error string `json:"error"`
	// With 122 (API_RATE_LIMITED): how long to wait, as the Retry-After header in milliseconds.
	RetryAfterMS uint32 `json:"retry_after_ms,omitempty"`
}

func writeError(w http.ResponseWriter, err error) {
	code, msg := errorCodeOf(err)
	if o, ok := w.(*observedWriter); ok {
		o.code, o.msg = code, msg
	}
	writeJSON(w, httpStatus(code), ErrorBody{Code: uint32(code), Name: codeName(code), Error: msg})
}
