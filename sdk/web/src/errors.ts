// Errors the client reports, and the names of the protocol's codes (docs/protocol.md §4, §5).

import { CloseCode, ErrorCode } from "./gen/client_pb.js";

/**
 * CODE_ABNORMAL_CLOSURE is the CloseError code for a connection that ended without a Roomcast
 * or WebSocket close code (a reset, a connection that never opened, a stream that broke
 * mid-frame). It is WebSocket's 1006 and counts as transient.
 */
export const CODE_ABNORMAL_CLOSURE = 1006;

// The WebSocket close codes a browser may report besides Roomcast's own (RFC 6455 §7.4.1).
const webSocketCloseNames: Record<number, string> = {
  1000: "NORMAL_CLOSURE",
  1001: "GOING_AWAY",
  1002: "PROTOCOL_ERROR",
  1003: "UNSUPPORTED_DATA",
  1005: "NO_STATUS",
  1006: "ABNORMAL_CLOSURE",
  1007: "INVALID_PAYLOAD",
  1008: "POLICY_VIOLATION",
  1009: "MESSAGE_TOO_BIG",
  1011: "INTERNAL_ERROR",
  1012: "SERVICE_RESTART",
  1013: "TRY_AGAIN_LATER",
  1015: "TLS_HANDSHAKE",
};

/** closeCodeName names a Kick or WebSocket close code, e.g. 4001 "BAD_TOKEN", 1006 "ABNORMAL_CLOSURE". */
export function closeCodeName(code: number): string {
  if (code >= 4000 && code < 5000) return CloseCode[code] ?? "UNKNOWN";
  return webSocketCloseNames[code] ?? "UNKNOWN";
}

/** errorCodeName names an Error frame's code, e.g. 102 "RATE_LIMITED". */
export function errorCodeName(code: number): string {
  return ErrorCode[code] ?? "UNKNOWN";
}

/**
 * terminalCode reports whether reconnecting without changing something (a new token, a fixed
 * client) fails again: codes 4000–4499 but 4013 and 4015 (limitedCode). Every other code is
 * transient.
 */
export function terminalCode(code: number): boolean {
  return code >= 4000 && code < 4500 && !limitedCode(code);
}

/**
 * limitedCode reports whether the server refused a login for now and said when to come back:
 * 4013 (LOGIN_RATE_LIMITED) and 4015 (TOO_MANY_CONNECTIONS). The client waits the Kick's
 * retryAfterMs plus jitter and logs in again.
 */
export function limitedCode(code: number): boolean {
  return code === CloseCode.LOGIN_RATE_LIMITED || code === CloseCode.TOO_MANY_CONNECTIONS;
}

/** RoomcastError is the base of every error the client reports. */
export class RoomcastError extends Error {
  override name = "RoomcastError";
}

/**
 * CloseError is why a connection ended: the code of the server's Kick or WebSocket close frame
 * (docs/protocol.md §5), or CODE_ABNORMAL_CLOSURE when it just dropped.
 */
export class CloseError extends RoomcastError {
  override name = "CloseError";
  constructor(
    /** A CloseCode (4000–4999), a WebSocket close code (1000–1015) or CODE_ABNORMAL_CLOSURE. */
    readonly code: number,
    /** The server's explanation, if it gave one. */
    readonly reason = "",
    /** With 4013 and 4015: the server's hint, how long to wait before logging in again (the Kick's retry_after_ms). */
    readonly retryAfterMs = 0,
  ) {
    super(`roomcast: connection closed: code ${code} (${closeCodeName(code)})${reason ? ": " + reason : ""}`);
  }
  /** Whether reconnecting with the same token fails again (4000–4499 but 4013 and 4015). */
  get terminal(): boolean {
    return terminalCode(this.code);
  }
  /** Whether the login was refused for now, to be tried again after retryAfterMs (4013, 4015). */
  get limited(): boolean {
    return limitedCode(this.code);
  }
}

/** SendError is a Send the server refused with an Error frame; the connection stays. */
export class SendError extends RoomcastError {
  override name = "SendError";
  constructor(
    /** An ErrorCode. */
    readonly code: number,
    readonly serverMessage = "",
    /** With 120 (SEND_RATE_LIMITED): the same send is accepted after this many milliseconds. */
    readonly retryAfterMs = 0,
  ) {
    super(`roomcast: send refused: code ${code} (${errorCodeName(code)})${serverMessage ? ": " + serverMessage : ""}`);
  }
}

/**
 * HistoryError is a history query the server refused with an Error frame (docs/protocol.md):
 * BAD_HISTORY_QUERY (110), HISTORY_BUSY (111: too many of this connection's queries wait;
 * retry after one answers) or UNAVAILABLE (503). The connection stays.
 */
export class HistoryError extends RoomcastError {
  override name = "HistoryError";
  constructor(
    /** An ErrorCode. */
    readonly code: number,
    readonly serverMessage = "",
  ) {
    super(`roomcast: history query refused: code ${code} (${errorCodeName(code)})${serverMessage ? ": " + serverMessage : ""}`);
  }

  /** temporary reports whether the same query may succeed later (5xx codes and HISTORY_BUSY). */
  get temporary(): boolean {
    return this.code >= 500 || this.code === ErrorCode.HISTORY_BUSY;
  }
}

/**
 * ProtocolError is a violation of the wire protocol by the server: a frame that does not parse,
 * a text message, a client-only frame, a frame out of order, or a first answer that is not a
 * LoginAck (a server speaking another protocol or version).
 */
export class ProtocolError extends RoomcastError {
  override name = "ProtocolError";
}

/** VersionError: the server's LoginAck names a protocol version this SDK does not speak. */
export class VersionError extends ProtocolError {
  override name = "VersionError";
}

/** HistoryUnavailableError: the history a login asked for did not come (the server could not read it, or did not answer within Config.recoveryWaitMs). */
export class HistoryUnavailableError extends RoomcastError {
  override name = "HistoryUnavailableError";
}

/** ServerTimeoutError: nothing arrived from the server for three heartbeat intervals. */
export class ServerTimeoutError extends RoomcastError {
  override name = "ServerTimeoutError";
}

/** LoginTimeoutError: the server did not answer the Login within Config.attemptTimeoutMs. */
export class LoginTimeoutError extends RoomcastError {
  override name = "LoginTimeoutError";
}

/** DispatchError: the dispatcher could not be asked, or answered with an error. */
export class DispatchError extends RoomcastError {
  override name = "DispatchError";
}

/** ClosedError is the error of a client that its user closed, and of sends after that. */
export class ClosedError extends RoomcastError {
  override name = "ClosedError";
  constructor() {
    super("roomcast: client closed");
  }
}

/** NotConnectedError: a send while the client is (re)connecting; nothing was sent. */
export class NotConnectedError extends RoomcastError {
  override name = "NotConnectedError";
  constructor() {
    super("roomcast: not connected");
  }
}

