package api

import (
	"fmt"
	"slices"
	"strings"

	"roomcast/proto/clientpb"
)

// The scopes of API keys: every call of the service needs one scope, and a key configured with
// scopes (auth.APIKey.Scopes) may only make the calls of those scopes; a key with none makes
// every call. callScopes is the one table of which call needs which scope; a call missing from
// it is refused to every key (TestEveryCallHasAScope keeps it complete).

// The scopes a key may be given.
const (
	// ScopeSend: send to rooms, users and sessions, and notices to every room.
	ScopeSend = "send"
	// ScopeModerate: kick, mute, ban, change members' tags, manage rooms' queues, reset counters, set rooms' attributes, recall messages.
	ScopeModerate = "moderate"
	// ScopeRead: read rooms, members, sessions, counts, tags, CDN settings, limits, history, queues, counters, attributes.
	ScopeRead = "read"
	// ScopeAdmin: create, change and close rooms, set CDN modes and policies, set the app's limits.
	ScopeAdmin = "admin"
)

// Scopes lists every scope, for checking a configuration.
var Scopes = []string{ScopeSend, ScopeModerate, ScopeRead, ScopeAdmin}

// callScopes maps each call of roomcast.v1.RoomcastAPI (its RPC name; the HTTP routes call the
// same methods) to the scope it needs.
var callScopes = map[string]string{
	"CreateRoom":        ScopeAdmin,
	"UpdateRoom":        ScopeAdmin,
	"CloseRoom":         ScopeAdmin,
	"SetRoomCdn":        ScopeAdmin,
	"SetCdnPolicy":      ScopeAdmin,
	"SetAppLimits":      ScopeAdmin,
	"SendToRoom":        ScopeSend,
	"SendBatchToRoom":   ScopeSend,
	"SendStream":        ScopeSend,
	"SendToUsers":       ScopeSend,
	"SendToSession":     ScopeSend,
	"SendToAllRooms":    ScopeSend,
	"Kick":              ScopeModerate,
	"MuteRoom":          ScopeModerate,
	"MuteMember":        ScopeModerate,
	"BanMember":         ScopeModerate,
	"SetMemberTags":     ScopeModerate,
	"OfferQueue":        ScopeModerate,
	"PollQueue":         ScopeModerate,
	"RemoveQueueEntry":  ScopeModerate,
	"ClearQueue":        ScopeModerate,
	"ResetCounter":      ScopeModerate,
	"SetRoomAttribute":  ScopeModerate,
	"RecallMessage":     ScopeModerate,
	"GetRoomAttributes": ScopeRead,
	"GetRoom":           ScopeRead,
	"ListMembers":       ScopeRead,
	"GetUserSessions":   ScopeRead,
	"CountOnline":       ScopeRead,
	"GetMemberTags":     ScopeRead,
	"GetRoomCdn":        ScopeRead,
	"GetCdnPolicy":      ScopeRead,
	"GetAppLimits":      ScopeRead,
	"GetHistory":        ScopeRead,
	"GetCounters":       ScopeRead,
	"PeekQueue":         ScopeRead,
	"ListQueue":         ScopeRead,
}

// scopeError refuses a call its key has no scope for: FORBIDDEN (HTTP 403, gRPC
// PermissionDenied), the message and the ErrorInfo's metadata "scope" naming the scope.
func scopeError(scope, call string) error {
	return apiErrorInfo(clientpb.ErrorCode_ERROR_CODE_FORBIDDEN, map[string]string{"scope": scope},
		"the API key lacks the scope %q, which %s needs", scope, call)
}

// CheckScopes checks that every scope is one of Scopes.
func CheckScopes(scopes []string) error {
	for _, s := range scopes {
		if !slices.Contains(Scopes, s) {
			return fmt.Errorf("unknown API key scope %q (want %s)", s, strings.Join(Scopes, ", "))
		}
	}
	return nil
}
