package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"roomcast/internal/auth"
	"roomcast/internal/bus"
	pb "roomcast/proto/roomcastpb"
)

// maxAPIBody limits a server API request body.
const maxAPIBody = 64 << 10

// APIConfig configures the server API.
type APIConfig struct {
	// Bus is the NATS connection to the services. Required.
	Bus *nats.Conn
	// Keys maps API keys to apps. Required.
	Keys auth.APIKeys
	// Timeout bounds each request to a service. Zero value means 3s.
	Timeout time.Duration
	// Log receives the API's logs. Zero value means none.
	Log *slog.Logger
}

// API is the HTTP/JSON server API for app backends. Every request carries an API key
// (`Authorization: Bearer KEY`), which names the app it acts for.
type API struct {
	cfg APIConfig
	log *slog.Logger
	mux *http.ServeMux
}

// NewAPI returns the server API handler.
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
	a := &API{cfg: cfg, log: log.With("svc", "api"), mux: http.NewServeMux()}
	a.mux.HandleFunc("POST /v1/rooms/{room}/messages", a.withApp(a.sendToRoom))
	a.mux.HandleFunc("GET /v1/rooms/{room}", a.withApp(a.roomInfo))
	a.mux.HandleFunc("GET /v1/rooms/{room}/settings", a.withApp(a.getSettings))
	a.mux.HandleFunc("PUT /v1/rooms/{room}/settings", a.withApp(a.putSettings))
	return a, nil
}

// ServeHTTP serves the API's routes.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// apiError is the body of every error answer.
type apiError struct {
	Code  uint32 `json:"code"`
	Name  string `json:"name"`
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code pb.ErrorCode, format string, args ...any) {
	writeJSON(w, httpStatus(code), apiError{Code: uint32(code), Name: strings.TrimPrefix(code.String(), "ERROR_CODE_"), Error: fmt.Sprintf(format, args...)})
}

// httpStatus maps an error code to the HTTP status that answers it.
func httpStatus(code pb.ErrorCode) int {
	switch code {
	case pb.ErrorCode_ERROR_CODE_OK:
		return http.StatusOK
	case pb.ErrorCode_ERROR_CODE_BAD_REQUEST, pb.ErrorCode_ERROR_CODE_BAD_TAG_EXPR:
		return http.StatusBadRequest
	case pb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE:
		return http.StatusRequestEntityTooLarge
	case pb.ErrorCode_ERROR_CODE_RATE_LIMITED:
		return http.StatusTooManyRequests
	case pb.ErrorCode_ERROR_CODE_FORBIDDEN:
		return http.StatusForbidden
	case pb.ErrorCode_ERROR_CODE_ROOM_NOT_FOUND:
		return http.StatusNotFound
	case pb.ErrorCode_ERROR_CODE_UNAUTHORIZED:
		return http.StatusUnauthorized
	case pb.ErrorCode_ERROR_CODE_UNAVAILABLE:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// withApp checks the request's API key and the room in its path, and passes the app on.
func (a *API) withApp(h func(w http.ResponseWriter, r *http.Request, app, room string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			writeError(w, pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "missing header Authorization: Bearer <API key>")
			return
		}
		app, ok := a.cfg.Keys.App(key)
		if !ok {
			writeError(w, pb.ErrorCode_ERROR_CODE_UNAUTHORIZED, "unknown API key")
			return
		}
		room := r.PathValue("room")
		if !auth.ValidName(room) {
			writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "room %q must be 1-128 characters of A-Z a-z 0-9 _ -", room)
			return
		}
		h(w, r, app, room)
	}
}

// SendBody is the JSON body of POST /v1/rooms/{room}/messages.
type SendBody struct {
	// Type is app-defined, e.g. "notice".
	Type string `json:"type"`
	// Lane is "critical", "normal" (default) or "bulk".
	Lane string `json:"lane"`
	// Body is the message text. Exactly one of Body and BodyBase64 is set.
	Body string `json:"body"`
	// BodyBase64 is a binary body, base64-encoded.
	BodyBase64 []byte `json:"body_base64"`
	// Sender is the uid shown as the sender; empty means the app itself.
	Sender string `json:"sender"`
	// TagExpr restricts delivery to members whose tags satisfy it.
	TagExpr string `json:"tag_expr"`
}

// SendResult answers a successful send.
type SendResult struct {
	ID           string `json:"id"`
	ServerTimeMS int64  `json:"server_time_ms"`
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

func (a *API) sendToRoom(w http.ResponseWriter, r *http.Request, app, room string) {
	var body SendBody
	if !decodeBody(w, r, &body) {
		return
	}
	lane, ok := ParseLane(body.Lane)
	if !ok {
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "lane %q is not critical, normal or bulk", body.Lane)
		return
	}
	if body.Body != "" && len(body.BodyBase64) > 0 {
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "set body or body_base64, not both")
		return
	}
	if body.Sender != "" && !auth.ValidName(body.Sender) {
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "sender %q must be 1-128 characters of A-Z a-z 0-9 _ -", body.Sender)
		return
	}
	payload := body.BodyBase64
	if body.Body != "" {
		payload = []byte(body.Body)
	}
	req := &pb.SendRequest{App: app, Room: room, Uid: body.Sender, Type: body.Type, Lane: lane, Body: payload, TagExpr: body.TagExpr, FromApp: true}
	if rep := ValidateSend(req); rep != nil {
		writeError(w, pb.ErrorCode(rep.Code), "%s", rep.Message)
		return
	}
	var rep pb.Reply
	if !a.request(r.Context(), w, bus.SubjectRoomSend, req, &rep) {
		return
	}
	writeJSON(w, http.StatusOK, SendResult{ID: rep.MessageId, ServerTimeMS: rep.ServerTimeMs})
}

// RoomInfoResult answers GET /v1/rooms/{room}.
type RoomInfoResult struct {
	Room   string           `json:"room"`
	Online int64            `json:"online"`
	Nodes  map[string]int64 `json:"nodes"`
}

func (a *API) roomInfo(w http.ResponseWriter, r *http.Request, app, room string) {
	var rep pb.Reply
	if !a.request(r.Context(), w, bus.SubjectRoomInfo, &pb.JoinRequest{App: app, Room: room}, &rep) {
		return
	}
	writeJSON(w, http.StatusOK, RoomInfoResult{Room: room, Online: rep.GetRoom().GetOnline(), Nodes: rep.GetRoom().GetNodes()})
}

// request asks a service and writes the error answer when it fails or refuses; it reports
// whether the caller should go on.
func (a *API) request(ctx context.Context, w http.ResponseWriter, subject string, req proto.Message, rep *pb.Reply) bool {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	if err := bus.Request(ctx, a.cfg.Bus, subject, req, rep); err != nil {
		a.log.Warn("service request failed", "subject", subject, "err", err)
		writeError(w, pb.ErrorCode_ERROR_CODE_UNAVAILABLE, "service did not answer")
		return false
	}
	if rep.Code != 0 {
		writeError(w, pb.ErrorCode(rep.Code), "%s", rep.Message)
		return false
	}
	return true
}

// SettingsBody is the JSON of a room's delivery settings (GET and PUT
// /v1/rooms/{room}/settings). Zero values mean the defaults.
type SettingsBody struct {
	// FlushTickMS is how long ChatLinks gather the room's messages into one frame (default 100).
	FlushTickMS uint32 `json:"flush_tick_ms"`
	// NoMerge writes every message as its own frame (for measuring what merging gains).
	NoMerge bool `json:"no_merge"`
	// NormalBudget is normal+bulk messages per member per second (default 20; negative: no limit).
	NormalBudget int32 `json:"normal_budget"`
	// CriticalBudget is critical messages per member per second before it is counted as over
	// budget; critical messages are never dropped (default 10; negative: no limit).
	CriticalBudget int32 `json:"critical_budget"`
	// SendExpr: who may send at all, a tag expression over the sender (empty: everyone).
	SendExpr string `json:"send_expr,omitempty"`
	// BroadcastExpr: who may send to the whole room or give a tag expression (empty: everyone
	// who may send).
	BroadcastExpr string `json:"broadcast_expr,omitempty"`
	// ScopePrefix: other senders' messages reach only members sharing their tags with this
	// prefix, e.g. "class:" (empty: other senders are refused).
	ScopePrefix string `json:"scope_prefix,omitempty"`
}

func settingsBody(st *pb.RoomSettings) SettingsBody {
	return SettingsBody{FlushTickMS: st.GetFlushTickMs(), NoMerge: st.GetNoMerge(), NormalBudget: st.GetNormalBudget(), CriticalBudget: st.GetCriticalBudget(),
		SendExpr: st.GetSendExpr(), BroadcastExpr: st.GetBroadcastExpr(), ScopePrefix: st.GetScopePrefix()}
}

func (a *API) getSettings(w http.ResponseWriter, r *http.Request, app, room string) {
	var rep pb.Reply
	if !a.request(r.Context(), w, bus.SubjectRoomSettings, &pb.SettingsRequest{App: app, Room: room}, &rep) {
		return
	}
	writeJSON(w, http.StatusOK, settingsBody(rep.Settings))
}

func (a *API) putSettings(w http.ResponseWriter, r *http.Request, app, room string) {
	var body SettingsBody
	if !decodeBody(w, r, &body) {
		return
	}
	st := &pb.RoomSettings{FlushTickMs: body.FlushTickMS, NoMerge: body.NoMerge, NormalBudget: body.NormalBudget, CriticalBudget: body.CriticalBudget,
		SendExpr: body.SendExpr, BroadcastExpr: body.BroadcastExpr, ScopePrefix: body.ScopePrefix}
	if err := ValidateSettings(st); err != nil {
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "%v", err)
		return
	}
	var rep pb.Reply
	if !a.request(r.Context(), w, bus.SubjectRoomSettings, &pb.SettingsRequest{App: app, Room: room, Update: true, Settings: st}, &rep) {
		return
	}
	writeJSON(w, http.StatusOK, settingsBody(rep.Settings))
}

// decodeBody reads a request's JSON body into v: one object, no unknown fields, at most
// maxAPIBody bytes. On failure it writes the error answer and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAPIBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, pb.ErrorCode_ERROR_CODE_MESSAGE_TOO_LARGE, "request body over %d bytes", maxAPIBody)
			return false
		}
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "body is not the expected JSON: %v", err)
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "body has data after the JSON object")
		return false
	}
	return true
}
