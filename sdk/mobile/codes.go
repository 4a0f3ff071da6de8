package mobile

// The protocol's codes (docs/protocol.md §4 and §5), as constants an app compares with
// SendResult.ErrorCode, HistoryPage.ErrorCode, QueueResult.ErrorCode and Event.Code:
// TestCodesMatchTheProtocol checks that every code of proto/client.proto is here, by the same
// name.

// Error codes: why the server refused a request (an Error frame); the connection stays up.
const (
	// ErrorBadRequest (100): The Send was malformed: no body, unknown lane, type too long.
	ErrorBadRequest = 100
	// ErrorMessageTooLarge (101): The body exceeds the room's message size limit.
	ErrorMessageTooLarge = 101
	// ErrorRateLimited (102): Too many sends; slow down.
	ErrorRateLimited = 102
	// ErrorForbidden (103): The sender may not send to this room (muted, not a member, not allowed
	// by tag).
	ErrorForbidden = 103
	// ErrorBadTagExpr (104): The tag expression does not parse or is not allowed.
	ErrorBadTagExpr = 104
	// ErrorRoomNotFound (105): The room does not exist or is closed.
	ErrorRoomNotFound = 105
	// ErrorUnauthorized (106): Missing or wrong credentials (server API).
	ErrorUnauthorized = 106
	// ErrorUserNotFound (107): The user has no session online (server API: kick, sessions).
	ErrorUserNotFound = 107
	// ErrorConflict (108): The request conflicts with the state of the room (e.g. an update of a
	// closed room).
	ErrorConflict = 108
	// ErrorBadRecoverSince (109): Login.recover_since is not a message id: no history follows (the
	// session goes on).
	ErrorBadRecoverSince = 109
	// ErrorBadHistoryQuery (110): A history query is malformed: a cursor that is not one, an id
	// that is not a message id, more than one of before_id, after_id and cursor, an unknown lane.
	ErrorBadHistoryQuery = 110
	// ErrorHistoryBusy (111): Too many history queries of this connection wait for an answer;
	// retry after one comes.
	ErrorHistoryBusy = 111
	// ErrorInboxFull (112): Server API: an at-least-once send stored nothing, because every user
	// named has as many messages stored as the deployment allows (--inbox-max-per-user).
	ErrorInboxFull = 112
	// ErrorAckFailed (113): An Ack frame could not be applied (the store did not answer): the
	// messages stay stored and come again at the next login.
	ErrorAckFailed = 113
	// ErrorQueueKeyExists (114): Room queue: an offer with if_absent named a key the queue holds
	// (someone else grabbed it), or a member offered a key another member owns.
	ErrorQueueKeyExists = 114
	// ErrorQueueNotFound (115): Room queue: no entry with that key, or the queue is empty (poll,
	// peek, remove).
	ErrorQueueNotFound = 115
	// ErrorQueueFull (116): Room queue: the queue holds as many entries as the room allows.
	ErrorQueueFull = 116
	// ErrorDeniedByApp (118): The app's send callback denied the message (docs/callbacks.md); the
	// Error's message is the app's reason. A send the callback could not judge is refused with 503
	// (UNAVAILABLE) when the app fails closed.
	ErrorDeniedByApp = 118
	// ErrorSendRateLimited (120): A Send refused by a send rate (of the connection, the user or
	// the room; the message says which). Error.retry_after_ms says when to send again; the
	// connection stays.
	ErrorSendRateLimited = 120
	// ErrorLoginRateLimited (121): A login refused by a login or join rate (of the address, the
	// app or the room): this Error, with retry_after_ms, comes right before the Kick 4013
	// (LOGIN_RATE_LIMITED).
	ErrorLoginRateLimited = 121
	// ErrorApiRateLimited (122): Server API: the key made more calls than its app's rate allows
	// (HTTP 429, Retry-After).
	ErrorApiRateLimited = 122
	// ErrorLaneNotAllowed (123): A member's Send named LANE_CRITICAL, which the room's
	// critical_expr and the member's token do not allow (by default only the app server sends
	// critical messages). Send it on another lane; the room may say to demote such sends instead
	// (demote_critical).
	ErrorLaneNotAllowed = 123
	// ErrorTooManyCounters (124): A CounterAdd named a counter the room does not have while the
	// room has as many counters as it may (32): add to one of those, or have the app server reset
	// one.
	ErrorTooManyCounters = 124
	// ErrorAttributesFull (125): A room attribute change would take the room past its limits
	// (16 attributes, a value of 4096 bytes, 16384 bytes of values together): take one out, or
	// shorten it.
	ErrorAttributesFull = 125
	// ErrorMessageNotFound (130): A recall named a message the room's history does not hold:
	// never sent to this room, or no longer kept (its count or age), or a bulk message (not kept;
	// the server API recalls those with unkept set).
	ErrorMessageNotFound = 130
	// ErrorRecallNotAllowed (131): A member's recall that the room does not allow: the room's
	// sender_recall_window_s is 0, or the message is not the member's.
	ErrorRecallNotAllowed = 131
	// ErrorRecallWindowPassed (132): A member's recall of a message older than the room's
	// sender_recall_window_s.
	ErrorRecallWindowPassed = 132
	// ErrorNotModerator (140): A moderate request (Mute, Unmute, Remove) from a member whose tags
	// satisfy neither the room's moderator_expr nor its moderator_room_expr: the member is not a
	// moderator of this room.
	ErrorNotModerator = 140
	// ErrorOutsideScope (141): A moderate request named a member outside the moderator's scope:
	// one sharing none of the moderator's tags that start with the room's moderator_scope_prefix,
	// or a room-wide moderator, whom only room-wide moderators may act on. For a recall, the member
	// is the message's sender; a scoped moderator may not recall the app server's.
	ErrorOutsideScope = 141
	// ErrorAttributesNotAllowed (150): A member's SetAttribute that the room does not permit: the
	// room's attributes_expr does not match the member (or the room names none: only the app
	// server sets attributes), or the key is not among its attribute_keys.
	ErrorAttributesNotAllowed = 150
	// ErrorInternal (500): A bug on our side.
	ErrorInternal = 500
	// ErrorUnavailable (503): A service needed for the request did not answer in time.
	ErrorUnavailable = 503
)

// Close codes: why the server ended a connection (Event.Code of EventKicked and EventClosed).
// 4000–4499 are terminal (the client stops), but 4013 and 4015, which say when to come back;
// 4500–4999 are transient (the client reconnects).
const (
	// CloseBadToken (4001): The token does not verify: bad signature, malformed, wrong app, or
	// claims missing.
	CloseBadToken = 4001
	// CloseTokenExpired (4002): The token has expired: get a new one from the app server.
	CloseTokenExpired = 4002
	// CloseBadFrame (4003): A frame did not parse, or came in the wrong order (a second Login, a
	// server-only frame).
	CloseBadFrame = 4003
	// CloseFrameTooLarge (4004): A frame exceeded the size limit. Over WebSocket the standard
	// close code 1009 is used.
	CloseFrameTooLarge = 4004
	// CloseNotLoggedIn (4005): A frame other than Login came before the login completed.
	CloseNotLoggedIn = 4005
	// CloseKicked (4007): The app server kicked this session (or banned the user).
	CloseKicked = 4007
	// CloseBanned (4008): The user is banned from the room.
	CloseBanned = 4008
	// CloseRoomClosed (4009): The room was closed by the app server, or the login named a closed
	// room.
	CloseRoomClosed = 4009
	// CloseReplaced (4010): Another session of the same user replaced this one (the app's multi-
	// device policy).
	CloseReplaced = 4010
	// CloseDeniedByApp (4011): The app's login callback denied the login (docs/callbacks.md); the
	// reason is the app's. A login the callback could not judge is closed with 4504 (UNAVAILABLE)
	// when the app fails closed.
	CloseDeniedByApp = 4011
	// CloseLoginRateLimited (4013): The login came faster than a login or join rate allows; the
	// Kick's retry_after_ms (and the Error 121 before it) says how long to wait. Not terminal
	// despite its range: wait that long plus jitter, then reconnect (through the dispatcher).
	// Reconnecting sooner fails again.
	CloseLoginRateLimited = 4013
	// CloseAddressDenied (4014): The client's address is denied by the node's or the app's address
	// lists (or not on an allow list). Over WebSocket and the HTTP fallback it is refused before
	// the upgrade with HTTP 403.
	CloseAddressDenied = 4014
	// CloseTooManyConnections (4015): The client's address has as many connections open on this
	// node as it allows. Over WebSocket and the HTTP fallback it is refused before the upgrade
	// with HTTP 429 and Retry-After (seconds). Not terminal despite its range: wait the Kick's
	// retry_after_ms (or Retry-After) plus jitter, then reconnect (through the dispatcher).
	CloseTooManyConnections = 4015
	// CloseShutdown (4500): The ChatLink is shutting down; dispatch again.
	CloseShutdown = 4500
	// CloseLoginTimeout (4501): No Login frame arrived in time after connecting.
	CloseLoginTimeout = 4501
	// CloseHeartbeatTimeout (4502): No heartbeat arrived in time.
	CloseHeartbeatTimeout = 4502
	// CloseSlowReader (4503): The client did not read fast enough even for the critical lane.
	CloseSlowReader = 4503
	// CloseUnavailable (4504): The login could not complete because a service did not answer; try
	// again.
	CloseUnavailable = 4504
	// CloseRoomFull (4505): The room has as many members as it allows; try again later.
	CloseRoomFull = 4505
	// CloseAbnormal (1006): the connection ended without a code (a reset, an end of file).
	CloseAbnormal = 1006
)
